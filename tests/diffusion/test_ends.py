"""One rule for what a masked-diffusion sampler may not write and where its answer ends (the Pipeline and the world's
diffusion experiment both use it)."""

import torch

from keepsight.diffusion.ends import bans_mask, cut_at_end, end_ids, suppressed_ids
from keepsight.models.llada_official import shipped_decoding
from keepsight.world.models import build_lavida, build_llada_v, llada_style_tokenizer, preset_processor


def test_the_worlds_sampler_bans_pad_and_bos_and_stops_at_eos():
    processor = preset_processor("tiny-llava")
    tok, model = processor.tokenizer, build_llada_v(processor)
    assert suppressed_ids(model, tok) == [tok.pad_token_id, tok.bos_token_id]
    assert end_ids(model, tok) == {tok.eos_token_id}
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]  # pad also ends an answer
    assert suppressed_ids(model, tok) == [tok.bos_token_id]  # so it stays allowed: the sampler could not stop


def test_llada_v_keeps_its_shipped_bans_and_lavida_bans_none():
    tok = llada_style_tokenizer()
    suppress, stop = shipped_decoding(tok)
    model = build_llada_v(preset_processor("tiny-llava"))
    assert suppress and suppressed_ids(model, tok) == suppress and set(stop) <= end_ids(model, tok)
    lavida, _ = build_lavida()
    assert suppressed_ids(lavida, tok) == []  # LaViDa's own sampler bans none, even with LLaDA's tokens
    assert suppressed_ids(lavida, preset_processor("tiny-llava").tokenizer) == []
    # and lets the mask compete (tests/models/test_lavida_reference.py: only so does it commit the release's slots)
    assert not bans_mask(lavida) and bans_mask(model)


def test_an_answer_ends_before_its_first_end_id():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [3, 3, 3, 9, 3]])
    assert cut_at_end(ids, {2, 9}) == [[5, 6], [5, 6, 7, 8], [3, 3, 3]]
