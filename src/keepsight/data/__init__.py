"""Data: the sample type (a conversation + its images), chat formatting with the checkpoint's own template,
padding side, and the collators with their label logic. Data sources yield ``Sample``s; the synthetic world
(``keepsight.world``) is one of them."""

from .chat import chat_example, padding_side, render, render_prompt
from .collator import IGNORE_INDEX, TextCollator, VLMCollator
from .sample import Sample, text_of, user_message

__all__ = ["IGNORE_INDEX", "Sample", "TextCollator", "VLMCollator", "chat_example", "padding_side", "render",
           "render_prompt", "text_of", "user_message"]
