"""The support matrix: read from the architecture table and the registry, shown in README, and every row's
processor fallback a class the loader knows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from keepsight.cli import main
from keepsight.inference.support import columns, kinds, matrix_markdown, support
from keepsight.models.arch import ARCHITECTURES, ArchSpec, check_method
from keepsight.models.checkpoint import FALLBACKS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_shows_the_matrix_as_the_command_prints_it(capsys):
    text = README.read_text()
    shown = re.search(r"<!-- keepsight models -->\n(.*?)<!-- /keepsight models -->", text, re.S)
    assert shown, "README has no <!-- keepsight models --> block"
    assert main(["models"]) == 0
    printed = capsys.readouterr().out
    assert shown.group(1) == printed == matrix_markdown(), "README's support matrix is stale: paste `keepsight models`"
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {k: support(k) for k in kinds()}


def test_cells_follow_the_rows():
    assert support("llava")["bridge"] is None and support("qwen3_vl")["bridge"].startswith("LIA-MTR replaces")
    assert all(support(kind)["opera"] is None for kind in ("llava_next", "internvl", "idefics3", "qwen3_5"))
    assert support("llada_v")["pvm"] == "-" and support("llava")["mps"] == "-"
    assert {name for name, _ in columns()} >= {"attention", "logit_lens", "lora", "pvm", "vcd", "opera", "mps"}
    with pytest.raises(ValueError, match="bridge does not apply to qwen3_vl: LIA-MTR replaces a LLaVA projector"):
        check_method("qwen3_vl", "bridge")


def test_every_fallback_is_a_class_the_loader_builds():
    for kind, spec in ARCHITECTURES.items():
        assert spec.processor_fallback is None or spec.processor_fallback in FALLBACKS, kind


def test_a_row_with_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="rope must be one of"):
        ArchSpec("x", "autoregressive", "model", rope="2d")
    with pytest.raises(ValueError, match="image_layout must be one of"):
        ArchSpec("x", "autoregressive", "model", image_layout="patches")


def test_a_method_no_test_runs_is_not_a_yes():
    """A decoding method registered without test settings gets "no" on every row of its family, with the reason."""
    from dataclasses import dataclass

    from keepsight.baselines import Baseline
    from keepsight.inference import METHODS, register_method

    @dataclass
    class BareConfig:
        factor: float = 1.0

    class Bare(Baseline):
        name = "bare"

    register_method("bare", BareConfig, Bare, family="autoregressive")
    try:
        cells = {kind: support(kind)["bare"] for kind in kinds()}
        assert all(why == "-" or "no test runs it" in why for why in cells.values())
        assert any(why != "-" for why in cells.values())
        assert "| no (" in matrix_markdown() and "bare is registered but its config declares no test" in matrix_markdown()
    finally:
        METHODS.pop("bare")
    assert all(why is None or why == "-" or "no test" not in why for kind in kinds() for why in support(kind).values())
