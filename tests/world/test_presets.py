"""The tiny presets' RoPE base: the regime recipe's preset turns its positions at base 300, the others keep the config
class's default (and the dicts, hence cache keys, they had before the field existed)."""

import json

import torch

from keepsight.cli import main
from keepsight.world.base import RECIPES, REGIME_RECIPE
from keepsight.world.models import (
    PRESETS,
    build_model,
    get_preset,
    llada_text_config,
    preset_processor,
    text_config,
)


def _inv_freq(model) -> torch.Tensor:
    return model.model.language_model.rotary_emb.inv_freq


def test_the_regime_preset_turns_its_positions_at_base_300():
    processor = preset_processor("tiny-llava-r300")
    tok = processor.tokenizer
    r300, default = get_preset("tiny-llava-r300"), get_preset("tiny-llava")
    assert text_config(r300, tok).rope_parameters["rope_theta"] == 300.0
    assert text_config(default, tok).rope_parameters["rope_theta"] == 10000.0
    assert llada_text_config(tok, r300).rope_parameters["rope_theta"] == 300.0
    d = r300.text_hidden // r300.text_heads
    want = 1.0 / 300.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    a, b = build_model("tiny-llava-r300", tok), build_model("tiny-llava", tok)
    torch.testing.assert_close(_inv_freq(a), want)
    assert not torch.allclose(_inv_freq(b), want)
    # the same weights (one seed), other positions: other logits past the first token
    b.load_state_dict(a.state_dict())
    ids = torch.randint(10, len(tok), (1, 24))
    with torch.no_grad():
        la, lb = a.model.language_model(input_ids=ids).last_hidden_state, b.model.language_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(la[:, 0], lb[:, 0])
    assert (la[:, 1:] - lb[:, 1:]).abs().max() > 1e-3


def test_presets_without_a_base_keep_their_dicts():
    for name, preset in PRESETS.items():
        assert ("rope_theta" in preset.to_dict()) == (preset.rope_theta is not None), name
    assert REGIME_RECIPE.preset == "tiny-llava-r300" and RECIPES["regime"] is REGIME_RECIPE
    assert REGIME_RECIPE.to_dict() == {**RECIPES["grounded"].to_dict(), "preset": "tiny-llava-r300"}


def test_world_train_takes_the_recipes_preset(tmp_path):
    out = tmp_path / "base"
    assert main(["world", "train", "--recipe", "regime", "--out", str(out), "--n", "8", "--stage", "lm",
                 "--steps-scale", "0.001", "--batch-size", "2", "--threads", "1"]) == 0
    assert json.loads((out / "train_config.json").read_text())["preset"] == "tiny-llava-r300"
    lm = json.loads((out / "stages" / "lm" / "config.json").read_text())
    assert lm["rope_parameters"]["rope_theta"] == 300.0
