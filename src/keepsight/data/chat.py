"""Chat formatting with the processor's own template, and the tokenizer's padding side."""

from __future__ import annotations

from contextlib import contextmanager

from .sample import Sample, user_message


@contextmanager
def padding_side(tokenizer, side: str):
    """Pad on ``side`` ("left" for generation, "right" for training) inside the block."""
    old = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield
    finally:
        tokenizer.padding_side = old


def render(processor, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """``messages`` through the processor's chat template, as text."""
    return processor.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def render_prompt(processor, sample: Sample) -> str:
    """The sample's conversation up to its last assistant turn, ready for the answer (generation prompt)."""
    return render(processor, sample.prompt_messages, add_generation_prompt=True)


def chat_example(processor, prompt: str, answer: str | None = None) -> str:
    """Chat-template text for one turn with one image; with ``answer`` the assistant turn (and eos) is included."""
    msgs = user_message(prompt)
    if answer is None:
        return render(processor, msgs, add_generation_prompt=True)
    msgs.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return render(processor, msgs)
