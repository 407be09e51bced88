"""The image withheld from the language model's sequence (PVM's mechanism control): the answer no longer depends on
the image, cached decoding agrees with it, PVM's memory still reads the image, and restoring gives the model back."""

import pytest
import torch
from test_probes import PRESETS, PROMPTS, assert_cached_scores_match_full, tiny_inputs

from keepsight.models.withhold import image_withheld, restore_image, withhold_image
from keepsight.pvm import PVMConfig, attach_pvm
from keepsight.world.models import build_model


def _other_image(inputs: dict) -> dict:
    other = dict(inputs)
    other["pixel_values"] = inputs["pixel_values"] + torch.randn_like(inputs["pixel_values"])
    return other


@pytest.mark.parametrize("preset", PRESETS)
def test_withheld_image_changes_nothing_the_text_sees(preset, processor):
    model = build_model(preset, processor.tokenizer).eval()
    inputs = tiny_inputs(preset, processor, PROMPTS)
    text = inputs["attention_mask"].bool() & ~torch.isin(inputs["input_ids"], torch.tensor(
        [processor.tokenizer.image_token_id, *([] if preset == "tiny-llava" else [model.config.image_token_id])]))
    with torch.no_grad():
        plain = model(**inputs).logits
        assert not torch.equal(plain, model(**_other_image(inputs)).logits)  # the image matters normally
        with image_withheld(model):
            a = model(**inputs).logits  # [B, T, V]
            b = model(**_other_image(inputs)).logits
        assert torch.equal(model(**inputs).logits, plain)  # restored on exit
    torch.testing.assert_close(a[text], b[text], atol=1e-6, rtol=1e-6)  # no text position sees the image
    assert not torch.allclose(a[text], plain[text], atol=1e-4)


@pytest.mark.parametrize("preset", PRESETS)
def test_withheld_cached_generation_equals_full_forward(preset, processor):
    model = build_model(preset, processor.tokenizer).eval()
    inputs = tiny_inputs(preset, processor, [PROMPTS[1]] * 2)
    withhold_image(model)
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert_cached_scores_match_full(model, inputs, out)
    restore_image(model)
    with pytest.raises(ValueError, match="not withheld"):
        restore_image(model)


def test_pvm_still_reads_the_withheld_image(processor):
    model = build_model("tiny-llava", processor.tokenizer).eval()
    attach_pvm(model, PVMConfig(layers=[1, 3]))
    with torch.no_grad():
        for block in model.pvm.values():
            block.gate.fill_(0.5)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    with torch.no_grad(), image_withheld(model):
        a = model(**inputs).logits[:, -1]
        b = model(**_other_image(inputs)).logits[:, -1]
    assert not torch.allclose(a, b, atol=1e-4)  # the image reaches the answer through PVM's memory alone
    with pytest.raises(ValueError, match="already withheld"), image_withheld(model):
        withhold_image(model)
