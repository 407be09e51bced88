"""Which tokens a masked-diffusion sampler may not write, and where its answer ends: one rule for every caller (the
Pipeline, the world's diffusion experiment, the benchmarks)."""

from __future__ import annotations

import torch

from ..models.arch import arch_spec
from ..models.llada_official import shipped_decoding


def end_ids(model, tokenizer) -> set[int]:
    """Every id that ends an answer: the tokenizer's eos, the generation config's (one or several), and LLaDA-V's
    shipped stop (``<|eot_id|>``) where the tokenizer has it."""
    ids = set(shipped_decoding(tokenizer)[1])
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def suppressed_ids(model, tokenizer) -> list[int]:
    """Ids the sampler never writes at a still-masked slot: none for LaViDa (its released sampler, llada/generate.py,
    bans none, whatever the tokenizer); LLaDA-V's bans as shipped where the tokenizer has them; otherwise pad and bos,
    which no answer contains (an id that also ends an answer stays allowed, or the sampler could never stop)."""
    if arch_spec(model).kind == "lavida":
        return []
    shipped = shipped_decoding(tokenizer)[0]
    if shipped:
        return shipped
    ends = end_ids(model, tokenizer)
    return [i for i in (tokenizer.pad_token_id, tokenizer.bos_token_id) if i is not None and i not in ends]


def bans_mask(model) -> bool:
    """Whether the sampler keeps the mask token out of its argmax and its confidence softmax: not for LaViDa (its
    released sampler lets the mask compete, and a slot that predicts it stays masked), keepsight's rule otherwise."""
    return arch_spec(model).kind != "lavida"


def cut_at_end(generated: torch.Tensor, ends: set[int]) -> list[list[int]]:
    """Generated ids [B, G] -> each row's ids before its first end id."""
    return [row[: next((j for j, t in enumerate(row) if t in ends), len(row))] for row in generated.tolist()]
