"""``OPERA``: the baseline object whose ``apply(model)`` puts OPERA's beam search in place of ``model.generate``."""

from __future__ import annotations

import copy
import functools

import torch

from ...models.arch import arch_info
from ..base import Baseline
from .beams import _together
from .config import OPERAConfig
from .rows import _split_rows
from .search import COUNTERS, _decode, ends

GENERATE_OPTIONS = {"max_new_tokens", "min_new_tokens", "do_sample", "num_beams", "pad_token_id", "eos_token_id",
                    "bos_token_id", "generation_config", "use_cache", "output_attentions", "temperature", "top_p",
                    "top_k", "length_penalty", "early_stopping", "num_return_sequences", "return_dict_in_generate",
                    "max_length"}


class OPERA(Baseline):
    name = "opera"

    def __init__(self, config: OPERAConfig | None = None, **settings):
        super().__init__(config or OPERAConfig(**settings))

    def _install(self, model, stack) -> None:
        cfg = self.config
        info = arch_info(model)
        original = model.generate  # the class's bound method
        self._stats.compares_logits = False  # OPERA re-ranks beams: there is no single "logits before" per step
        # every counter but the forwards (the Stats' own field) in extra, and the rows the model's own search ran
        self._stats.extra.update(dict.fromkeys([*(c for c in COUNTERS if c != "forwards"), "delegated_rows"], 0))

        @functools.wraps(original)
        def generate(*args, **kwargs):
            if args:
                if len(args) > 1 or "input_ids" in kwargs or "inputs" in kwargs:
                    raise ValueError("OPERA's generate takes the inputs as keyword arguments (input_ids=...)")
                kwargs["input_ids"] = args[0]
            if "inputs" in kwargs:
                kwargs["input_ids"] = kwargs.pop("inputs")
            if kwargs.get("input_ids") is None:
                raise ValueError("OPERA's generate needs input_ids")
            opts = {k: kwargs.pop(k) for k in list(kwargs) if k in GENERATE_OPTIONS}
            if cfg.disabled:  # plain beam search: the model's own
                self._stats.rows += kwargs["input_ids"].shape[0]
                self._stats.extra["delegated_rows"] += kwargs["input_ids"].shape[0]
                return original(**kwargs, **{**opts, "num_beams": cfg.num_beams, "do_sample": False})
            return self._generate(model, info, kwargs, opts)

        model.generate = generate  # an instance attribute: the class's method comes back on exit
        stack.callback(lambda: model.__dict__.pop("generate", None))

    def _generate(self, model, info, kwargs: dict, opts: dict) -> torch.Tensor:
        unknown = sorted(k for k in kwargs if k not in ("input_ids", "attention_mask", *info.spec.token_inputs,
                                                        *info.spec.image_inputs))
        if unknown:
            raise ValueError(f"OPERA's generate does not take {unknown}")
        gc = copy.deepcopy(opts.pop("generation_config", None) or model.generation_config)
        for key in ("max_new_tokens", "min_new_tokens", "pad_token_id", "eos_token_id", "length_penalty",
                    "early_stopping", "num_return_sequences", "return_dict_in_generate", "do_sample", "max_length"):
            if key in opts and opts[key] is not None:
                setattr(gc, key, opts[key])
        if gc.do_sample:
            raise ValueError("OPERA is a beam search: do_sample must be False")
        if (gc.num_return_sequences or 1) != 1 or gc.return_dict_in_generate:
            raise ValueError("OPERA's generate returns one sequence per row as a tensor (num_return_sequences=1, "
                             "return_dict_in_generate=False)")
        ids = kwargs["input_ids"]
        if gc.max_new_tokens is not None:
            max_new = int(gc.max_new_tokens)
        else:
            max_new = int(gc.max_length) - ids.shape[1]  # HF: max_length counts the (padded) prompt
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new}")
        eos, pad = ends(gc.eos_token_id, gc.pad_token_id)
        counters = dict.fromkeys(COUNTERS, 0)
        rows = _split_rows(model, kwargs, info)
        outs = []
        for group in [rows] if _together(model) else [[row] for row in rows]:
            outs += [new for new, _ in _decode(model, group, max_new, self.config, eos=eos, pad=pad,
                                               min_new_tokens=int(gc.min_new_tokens or 0),
                                               length_penalty=1.0 if gc.length_penalty is None
                                               else float(gc.length_penalty),
                                               early_stopping=gc.early_stopping or False, st=counters)]
        self._stats.rows += len(outs)
        self._stats.forwards += counters.pop("forwards")
        self._stats.acted += counters["steps"]
        for key, value in counters.items():
            self._stats.extra[key] += value
        width = max(o.shape[0] for o in outs)
        out = torch.full((ids.shape[0], ids.shape[1] + width), pad, dtype=ids.dtype, device=ids.device)
        out[:, : ids.shape[1]] = ids
        for b, new in enumerate(outs):
            out[b, ids.shape[1]: ids.shape[1] + new.shape[0]] = new
        return out
