import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def processor():
    from keepsight.world.processor import build_processor

    return build_processor()
