"""The one sample type every data source yields and every collator reads: a conversation and its images."""

from __future__ import annotations

from dataclasses import dataclass, field


def text_of(content) -> str:
    """The text of a chat message's content (a string, or a list of ``{"type": "text", "text": ...}`` parts)."""
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def user_message(prompt: str, n_images: int = 1) -> list[dict]:
    """One user turn: ``n_images`` image parts, then the prompt (the layout every chat template here reads)."""
    return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": prompt}]}]


@dataclass
class Sample:
    """A conversation in Hugging Face chat format (``messages``: ``{"role", "content"}`` dicts whose content parts
    ``{"type": "image"}`` mark where the images go, in order) with its ``images`` (PIL images) and an ``id``.

    Training labels are the assistant turns; a sample for generation ends with a user turn."""

    messages: list[dict]
    images: list = field(default_factory=list)
    id: str | None = None

    @classmethod
    def single_turn(cls, prompt: str, answer: str | None = None, image=None, id: str | None = None) -> Sample:
        """One user turn (the image first, then ``prompt``), and the assistant's ``answer`` when given."""
        messages = user_message(prompt, 0 if image is None else 1)
        if answer is not None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
        return cls(messages, [] if image is None else [image], id)

    @property
    def prompt_messages(self) -> list[dict]:
        """The conversation before its last assistant turn (what a model is asked to continue)."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            return self.messages[:-1]
        return self.messages

    @property
    def answer(self) -> str | None:
        """The text of the last assistant turn, or None when the conversation does not end with one."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            return text_of(self.messages[-1]["content"])
        return None

    @property
    def prompt(self) -> str:
        """The text of the last user turn."""
        users = [m for m in self.prompt_messages if m["role"] == "user"]
        return text_of(users[-1]["content"]) if users else ""
