"""Data: the sample type (a conversation + its images), the sources that read a user's datasets as samples
(LLaVA JSON / JSONL, Hugging Face datasets) with their pre-flight check, chat formatting with the checkpoint's
own template, padding side, and the collators with their label logic. The synthetic world
(``keepsight.world``) is a source of its own."""

from .chat import chat_example, padding_side, render, render_prompt
from .collator import IGNORE_INDEX, TextCollator, VLMCollator
from .sample import Sample, text_of, user_message
from .sources import HFSource, LlavaSource, PreflightReport, export_llava, open_dataset, open_image, preflight

__all__ = ["IGNORE_INDEX", "HFSource", "LlavaSource", "PreflightReport", "Sample", "TextCollator", "VLMCollator",
           "chat_example", "export_llava", "open_dataset", "open_image", "padding_side", "preflight", "render",
           "render_prompt", "text_of", "user_message"]
