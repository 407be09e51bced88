"""Method layouts are found through the ``keepsight.layouts`` entry points (the loader imports no method: the layer
order in tests/test_layout.py holds it)."""

import pytest

from keepsight.models import layouts as layouts_module
from keepsight.models.layouts import Layout, layout_of, layouts
from keepsight.pvm.layout import LAYOUT

RELEASED = {"model_type": "qwen3_vl", "text_config": {"pvm_hidden_size": 32, "pvm_layers": [1]}}


def test_the_released_pvm_layout_is_found_through_its_entry_point():
    assert layouts()["pvm"] is LAYOUT
    assert layout_of(RELEASED) is LAYOUT and layout_of({"model_type": "qwen3_vl", "text_config": {}}) is None
    with pytest.raises(ValueError, match="pvm_layers"):  # half declared: an error, not a plain checkpoint
        layout_of({"text_config": {"pvm_hidden_size": 32}})


class _EntryPoint:
    def __init__(self, name, value):
        self.name, self.value, self._value = name, f"tests:{name}", value

    def load(self):
        return self._value


def test_a_bad_or_missing_reader_or_two_claims_on_one_config_are_refused(monkeypatch):
    def with_entries(*entries):
        monkeypatch.setattr(layouts_module, "entry_points", lambda group: list(entries))

    with_entries(_EntryPoint("pvm", LAYOUT), _EntryPoint("odd", object()))
    with pytest.raises(TypeError, match="odd"):
        layouts()
    with_entries()
    with pytest.raises(RuntimeError, match="make install"):
        layout_of(RELEASED)
    with_entries(_EntryPoint("pvm", LAYOUT), _EntryPoint("copy", Layout("copy", lambda c: True, LAYOUT.load)))
    with pytest.raises(ValueError, match="more than one method layout: pvm, copy"):
        layout_of(RELEASED)
