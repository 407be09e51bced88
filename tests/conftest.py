import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def processor():
    from keepsight.world.processor import build_processor

    return build_processor()


# ----------------------------------------------------------------------------- tiny diffusion models


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls: one intra-op thread is as fast, and far faster when the other core is busy."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def lm(processor):
    from keepsight.world.models import build_llada_lm

    return build_llada_lm(processor.tokenizer)


@pytest.fixture(scope="module")
def vlm(processor):
    from keepsight.world.models import build_llada_v

    return build_llada_v(processor)
