"""Report pieces for PVM's mechanism control (the image withheld from the language model): HTML sections and the
Markdown summary."""

from __future__ import annotations

from pathlib import Path

from .html import md_table, table

LABELS = {"base_with_image": "base, image seen", "base": "base, image withheld (text-only level)",
          "pvm_sft": "+ PVM stage 1, image withheld", "lora": "+ LoRA (matched), image withheld"}


def _label(arm: str, res: dict) -> str:
    """An arm's row label; an ablation arm names the block settings it changed."""
    ablation = res.get("config", {}).get("ablations", {}).get(arm)
    if ablation is not None:
        changed = ", ".join(f"{k}={v}" for k, v in ablation.items())
        return f"+ PVM stage 1 ({changed}), image withheld"
    return LABELS.get(arm, arm)


def _rows(scores: dict, res: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of one lens: ``scores`` is arm -> column -> {acc, low, high}."""
    arms = list(scores)
    cols = list(scores[arms[0]])
    rows = [[_label(a, res)] + [f"{v['acc']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
                                  for v in (scores[a][c] for c in cols)] for a in arms]
    return ["arm"] + cols, rows


def _verdict(res: dict) -> str:
    parts = []
    lora = res["arms"].get("lora", {}).get("all")
    for arm, v in res["verdict"].items():
        word = "above" if v["above_text_only"] else "not above"
        part = f"{_label(arm, res)}: {v['gain']:+.3f} against the text-only level, {word} it"
        if arm != "lora" and lora is not None:  # the fair control: the same training without a path to the image
            own = res["arms"][arm]["all"]
            apart = "above" if own["low"] > lora["high"] else "not above"
            part += f"; {own['acc'] - lora['acc']:+.3f} against the LoRA, {apart} it"
        parts.append(part)
    return "; ".join(parts) + " (95% intervals)."


INTRO = ("The image's tokens masked out of the language model's attention; its embeddings stay in PVM's visual memory. "
         "Yes/no on the prior-balanced set: every question asked of its own scene and of another where the same "
         "words have the other answer, so a model that does not see the image scores exactly 0.500. PVM must rise "
         "above the base's text-only level; the LoRA cannot. 95% Wilson intervals.")
ORDINARY = ("The same arms on the ordinary yes/no set (each scene's own questions), where the question's words carry "
            "the world's priors:")


def control_sections(res: dict, run_dir: Path | None = None) -> list[tuple[str, str]]:
    return [("PVM mechanism control: the image only in PVM's memory",
             f"<p>{INTRO}</p>" + table(*_rows(res["arms"], res)) + f"<p>{_verdict(res)}</p>"
             + (f"<p>{ORDINARY}</p>" + table(*_rows(res["ordinary"], res)) if "ordinary" in res else "")
             + "<p>Open answers:</p>" + table(*_rows(res["open"], res)))]


def control_markdown(res: dict) -> str:
    lines = ["", "PVM mechanism control (the image withheld from the language model, held-out prior-balanced yes/no, "
             "95% intervals):", "", *md_table(*_rows(res["arms"], res), cell=str), "", _verdict(res)]
    if "ordinary" in res:
        lines += ["", ORDINARY, "", *md_table(*_rows(res["ordinary"], res), cell=str)]
    lines += ["", "The same arms' open answers (exact match, 95% intervals):", "", *md_table(*_rows(res["open"], res), cell=str)]
    return "\n".join(lines)
