"""LLaDA-V as shipped: a tiny directory laid out like the official release (llava_llada config with mm_* fields,
LLaVA-repository weight names, the tower named by mm_vision_tower) loads through load_checkpoint with no
hand-written config and gives the same logits as the same weights in transformers' own layout."""

import json

import pytest
import torch
from PIL import Image
from transformers import LlavaProcessor

from keepsight.data import Sample, render_prompt
from keepsight.diffusion import generate
from keepsight.models import checkpoint_kind, load_checkpoint
from keepsight.models.llada_official import KNOWN_TOWERS, LLADA_V_SYSTEM, official_config, shipped_decoding
from keepsight.world.models import build_llada_v_siglip, llada_style_tokenizer
from keepsight.world.processor import build_processor
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("llada-v")
    official = save_tiny_checkpoint("tiny-llada-v-official", root / "official")
    processor = build_processor(tokenizer=llada_style_tokenizer())
    model, images = build_llada_v_siglip(processor, seed=0)  # the same seeded weights, transformers' layout
    hf = root / "hf"
    model.save_pretrained(hf)
    LlavaProcessor(image_processor=images, tokenizer=processor.tokenizer, patch_size=16,
                   vision_feature_select_strategy="full", num_additional_image_tokens=0,
                   chat_template=processor.chat_template).save_pretrained(hf)
    return official, hf


def _inputs(processor):
    img = Image.new("RGB", (64, 64), (200, 20, 20))
    text = render_prompt(processor, Sample.single_turn("describe the scene .", image=img))
    return processor(text=[text], images=[img], return_tensors="pt")


def test_official_layout_loads_and_matches_the_hf_layout(dirs):
    official, hf = dirs
    raw = json.loads((official / "config.json").read_text())
    assert raw["model_type"] == "llava_llada" and raw["mm_projector_type"] == "mlp2x_gelu"
    assert checkpoint_kind(official) == "llava_llada" and checkpoint_kind(hf) == "llada_v"
    a, pa = load_checkpoint(official, dtype="float32", device="cpu")
    b, pb = load_checkpoint(hf, dtype="float32", device="cpu")
    enc = _inputs(pa)  # LLaDA-V's prompt as shipped; the same ids go to both models
    assert int((enc["input_ids"] == a.config.image_token_id).sum()) == 16  # every SigLIP patch, no CLS
    with torch.no_grad():
        torch.testing.assert_close(a(**enc).logits, b(**enc).logits, rtol=1e-5, atol=1e-5)
    assert a.config.vision_feature_layer == -2 and a.config.text_config.mask_token_id == pa.tokenizer.mask_token_id
    out = generate(a, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=4, steps=2)
    assert out.generated.shape == (1, 4)


def test_the_hub_towers_are_built_from_their_known_sizes(dirs):
    official, _ = dirs
    raw = json.loads((official / "config.json").read_text())
    cfg = official_config({**raw, "mm_vision_tower": "google/siglip2-so400m-patch14-384", "mm_hidden_size": 1152},
                          official)
    v = cfg.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.patch_size, v.image_size) == (1152, 27, 14, 384)
    assert cfg.image_seq_length == 27 * 27 and KNOWN_TOWERS["google/siglip2-so400m-patch14-384"]["hidden_size"] == 1152


@pytest.mark.parametrize("change, message", [
    ({"mm_projector_type": "linear"}, "mm_projector_type 'linear'"),
    ({"mm_vision_tower": "someone/unknown-tower"}, "neither a local directory"),
    ({"mm_hidden_size": 7}, "mm_hidden_size 7 but the tower is"),
])
def test_official_config_errors_name_the_field(dirs, change, message):
    official, _ = dirs
    raw = json.loads((official / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        official_config({**raw, **change}, official)


def test_prompt_as_shipped_system_headers_and_the_dropped_token_after_the_image(dirs):
    """LLaDA-V's scripts send conv_llava_llada (its system prompt, LLaMA-3 headers, trimmed content) and tokenize it
    with tokenizer_image_token, which drops the first token after each image; the tokenizer's own template (string
    content only, no system prompt) is not used."""
    official, _ = dirs
    _, proc = load_checkpoint(official, dtype="float32", device="cpu")
    tok = proc.tokenizer
    assert "message['content'] | trim" in tok.chat_template  # the directory's own template: string content only
    img = Image.new("RGB", (64, 64), (200, 20, 20))
    text = render_prompt(proc, Sample.single_turn("  describe the scene .", image=img))
    assert text == ("<|startoftext|><|start_header_id|>system<|end_header_id|>\n\n" + LLADA_V_SYSTEM + "<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\n<image>\ndescribe the scene .<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    only_text = render_prompt(proc, Sample.single_turn("what is a scene ?"))
    assert "<image>" not in only_text and only_text.count(LLADA_V_SYSTEM) == 1
    enc = proc(text=[text], images=[img], return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    after = ids[max(j for j, t in enumerate(ids) if t == proc.tokenizer.convert_tokens_to_ids("<image>")) + 1:]
    want = tok("the scene .<|eot_id|><|start_header_id|>assistant<|end_header_id|>", add_special_tokens=False)
    assert after == want.input_ids  # "describe", the first token after the image, is dropped as shipped
    assert enc["attention_mask"].shape == enc["input_ids"].shape


def test_decoding_as_shipped_bans_and_stop(dirs):
    official, _ = dirs
    _, proc = load_checkpoint(official, dtype="float32", device="cpu")
    tok = proc.tokenizer
    suppress, stop = shipped_decoding(tok)
    names = ["<|endoftext|>", "<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>"]
    assert suppress == [tok.convert_tokens_to_ids(n) for n in names] and stop == [tok.convert_tokens_to_ids("<|eot_id|>")]
    assert shipped_decoding(build_processor().tokenizer) == ([], [])  # not LLaDA's tokenizer: nothing assumed


def test_loading_builds_no_random_model_first(dirs, monkeypatch):
    """The weights load into a model built on the meta device (an 8B LLaDA-V in fp32 would be 34 GB of random
    weights first): a random initialisation of real memory is an error here (on meta tensors it costs nothing)."""
    official, _ = dirs

    def guard(init):
        def run(tensor, *a, **k):
            if not tensor.is_meta:
                raise AssertionError("a random initialisation of real memory ran")
            return init(tensor, *a, **k)
        return run

    for name in ("kaiming_uniform_", "normal_", "uniform_", "trunc_normal_", "xavier_uniform_"):
        monkeypatch.setattr(torch.nn.init, name, guard(getattr(torch.nn.init, name)))
    model, _ = load_checkpoint(official, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.is_meta for p in model.parameters())


def test_a_garbled_tower_config_or_missing_tokenizer_is_named(dirs, tmp_path):
    import shutil

    official, _ = dirs
    broken = tmp_path / "broken"
    shutil.copytree(official, broken)
    (broken / "siglip-tower" / "config.json").write_text('{"hidden_size": 8,')
    with pytest.raises(ValueError, match=r"siglip-tower/config\.json is not a tower config"):
        load_checkpoint(broken, dtype="float32", device="cpu")
    shutil.rmtree(broken)
    shutil.copytree(official, broken)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (broken / f).unlink()
    with pytest.raises(ValueError, match=r"broken: cannot load its tokenizer \(tokenizer files: none"):
        load_checkpoint(broken, dtype="float32", device="cpu")
