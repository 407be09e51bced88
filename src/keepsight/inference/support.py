"""The support matrix: which method and diagnostic runs on which architecture, read from the architecture table
(``keepsight.models.arch``) and the method registry, so it cannot drift from either. ``keepsight models`` prints
it; README shows its output.

A cell is ``yes`` (it runs: the tests build a tiny model of that row and run it), ``-`` (another family's
method) or ``no`` with a footnote (the row rules it out, and applying it is an error naming the reason; or a
registered decoding method declares no settings for the tests, so no test runs it on any row).
"""

from __future__ import annotations

from ..models.arch import ARCHITECTURES
from .registry import FAMILIES, METHODS, MODEL_SIDE

# what runs on a model beside the registry's methods: the diagnostics and the LoRA control arm (a training recipe)
EXTRA = {"attention": "autoregressive", "logit_lens": "autoregressive", "lora": "autoregressive"}
TITLES = {"attention": "attention mass / TVR", "logit_lens": "LogitLens", "lora": "LoRA control",
          "diffusion": "LLaDA sampler"}


def columns() -> list[tuple[str, str]]:
    """``(name, family)`` of every matrix column: diagnostics first, then the model-side methods, then the decoding
    methods by family and name (the same order whatever order their packages registered in)."""
    load = [(n, METHODS[n].family) for n in MODEL_SIDE if n != "none" and n in METHODS]
    decode = sorted(((m.name, m.family) for m in METHODS.values() if m.stage == "decode"),
                    key=lambda nf: (FAMILIES.index(nf[1]), nf[0]))
    methods = load + decode
    return [(n, f) for n, f in EXTRA.items() if n != "lora"] + [("lora", "autoregressive")] + methods


def kinds() -> list[str]:
    """The rows of the matrix: every kind ``load_checkpoint`` reads."""
    return [k for k, spec in ARCHITECTURES.items() if spec.loadable]


def untested(name: str) -> str | None:
    """Why no test runs the registered decoding method ``name`` (None: its config declares ``ZERO`` and ``STRONG``,
    which the family tests run on every row, or ``TESTED_BY``, its own tests; or it is not a decoding method)."""
    entry = METHODS.get(name)
    if entry is None or entry.stage != "decode" or entry.tested_by or (entry.zero is not None
                                                                          and entry.strong is not None):
        return None
    return (f"{name} is registered but its config declares no test settings (ZERO and STRONG, or TESTED_BY), so no "
            "test runs it")


def support(kind: str) -> dict[str, str | None]:
    """``{column: None (runs) | "-" (another family's) | why it does not apply or is not tested}`` for one kind."""
    spec = ARCHITECTURES[kind]
    return {name: "-" if family != spec.family else spec.why_not(name) or untested(name) for name, family in columns()}


def matrix_markdown() -> str:
    """The matrix as a Markdown table, reasons as numbered footnotes below it."""
    cols = columns()
    head = "| model_type | family | " + " | ".join(TITLES.get(n, n) for n, _ in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    notes: list[str] = []
    for kind in kinds():
        cells = []
        for name, _ in cols:
            why = support(kind)[name]
            if why is None:
                cells.append("yes")
            elif why == "-":
                cells.append("-")
            else:
                if why not in notes:
                    notes.append(why)
                cells.append(f"no ({notes.index(why) + 1})")
        lines.append(f"| `{kind}` | {ARCHITECTURES[kind].family} | " + " | ".join(cells) + " |")
    lines += [""] + [f"({i}) {why}" for i, why in enumerate(notes, 1)]
    return "\n".join(lines).rstrip() + "\n"
