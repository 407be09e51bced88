"""Image-only processors for families whose transformers processor also builds a video processor.

Every video processor class needs torchvision, which keepsight's CPU install does not have, and ``ProcessorMixin``
refuses ``video_processor=None``. Each class here is its family's processor with ``__init__``'s arguments less
``video_processor`` (``ProcessorMixin`` reads its sub-processors and the arguments it saves from that signature), so
no video processor is asked for, saved or loaded; ``__call__``, the placeholder expansion and the chat template are
the family's own code. keepsight measures images only, so nothing it runs is lost.

The architecture table names one of these as a row's ``processor_fallback``; ``load_processor`` builds it when the
directory's own processor cannot be built. ``register_image_only`` registers them with ``AutoProcessor`` (by
config, only where torchvision is missing), so a directory saved with one of them loads back by its class name.

``PixtralProcessor`` (Mistral 3's) has no video half, but its module imports one helper from the torchvision image
processor's module; ``pixtral_processor`` imports it with the identical helper of the PIL image processor's module
standing in (only where torchvision is missing).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from transformers import (
    AutoProcessor,
    Gemma4Config,
    Gemma4Processor,
    Glm4vConfig,
    Glm4vProcessor,
    InternVLConfig,
    InternVLProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionProcessor,
    ProcessorMixin,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3VLMoeConfig,
    Qwen3VLProcessor,
    SmolVLMConfig,
    SmolVLMProcessor,
)


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


class LlavaOnevisionProcessorImageOnly(LlavaOnevisionProcessor):
    def __init__(self, image_processor=None, tokenizer=None, num_image_tokens=None,
                 vision_feature_select_strategy=None, chat_template=None, image_token="<image>",
                 video_token="<video>", vision_aspect_ratio="anyres_max_9", **kwargs):
        super().__init__(image_processor, tokenizer, None, num_image_tokens=num_image_tokens,
                         vision_feature_select_strategy=vision_feature_select_strategy, chat_template=chat_template,
                         image_token=image_token, video_token=video_token, vision_aspect_ratio=vision_aspect_ratio,
                         **kwargs)


class InternVLProcessorImageOnly(InternVLProcessor):
    def __init__(self, image_processor=None, tokenizer=None, image_seq_length: int = 256, chat_template=None,
                 **kwargs):
        super().__init__(image_processor, tokenizer, None, image_seq_length=image_seq_length,
                         chat_template=chat_template, **kwargs)


class Qwen3VLProcessorImageOnly(Qwen3VLProcessor):
    """Qwen3-VL's processor, also Qwen3.5's, Qwen3.5-MoE's and Qwen3-VL-MoE's."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Glm4vProcessorImageOnly(Glm4vProcessor):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class SmolVLMProcessorImageOnly(SmolVLMProcessor):
    """SmolVLM's processor without its video half. The family's ``__init__`` refuses to run without the ``num2words``
    package (not a dependency of keepsight), which only its video prompts use ("a video of {num2words(n)} frames"),
    so this one sets the attributes that ``__init__`` sets, as it sets them, and skips that check."""

    def __init__(self, image_processor, tokenizer, image_seq_len: int = 169, chat_template: str | None = None,
                 **kwargs):
        self.fake_image_token = getattr(tokenizer, "fake_image_token", "<fake_token_around_image>")
        self.image_token = getattr(tokenizer, "image_token", "<image>")
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.end_of_utterance_token = getattr(tokenizer, "end_of_utterance_token", "<end_of_utterance>")
        self.global_image_token = getattr(tokenizer, "global_image_token", "<global-img>")
        self.image_seq_len = image_seq_len
        self.video_token = getattr(tokenizer, "video_token", "<video>")
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        # SmolVLM's own adds its video processor's frame-sampling defaults to the kwargs; there is none here
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)


_PIXTRAL = "transformers.models.pixtral"


class Gemma4ProcessorImageOnly(Gemma4Processor):
    """Gemma 4's processor without its video half; it keeps the audio feature extractor (which needs nothing more).
    ``Gemma4Processor.__init__`` hands ``video_processor`` to ``ProcessorMixin`` by keyword, which a signature without
    it refuses, so this one sets the attributes that ``__init__`` sets, as it sets them."""

    def __init__(self, feature_extractor, image_processor, tokenizer, chat_template=None, image_seq_length: int = 280,
                 audio_seq_length: int = 750, audio_ms_per_token: int = 40, **kwargs):
        self.image_seq_length = image_seq_length
        self.image_token_id = tokenizer.image_token_id
        self.boi_token = tokenizer.boi_token
        self.eoi_token = tokenizer.eoi_token
        self.image_token = tokenizer.image_token
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|video|>"]})  # as Gemma4Processor does
        self.video_token = "<|video|>"
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        self.audio_seq_length = audio_seq_length
        self.audio_ms_per_token = audio_ms_per_token
        self.audio_token_id = getattr(tokenizer, "audio_token_id", None)
        self.audio_token = getattr(tokenizer, "audio_token", None)
        self.boa_token = getattr(tokenizer, "boa_token", None)
        self.eoa_token = getattr(tokenizer, "eoa_token", None)
        ProcessorMixin.__init__(self, feature_extractor=feature_extractor, image_processor=image_processor,
                                tokenizer=tokenizer, chat_template=chat_template, **kwargs)


def pixtral_processor() -> type:
    """transformers' ``PixtralProcessor`` class, importable without torchvision (see the module docstring). Its
    module is imported by name: importing it is what fails where torchvision is missing."""
    try:
        return importlib.import_module(f"{_PIXTRAL}.processing_pixtral").PixtralProcessor
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            raise
    pil = importlib.import_module(f"{_PIXTRAL}.image_processing_pil_pixtral")
    stand_in = types.ModuleType(f"{_PIXTRAL}.image_processing_pixtral")
    stand_in.get_resize_output_image_size = pil.get_resize_output_image_size
    sys.modules[stand_in.__name__] = stand_in
    cls = importlib.import_module(f"{_PIXTRAL}.processing_pixtral").PixtralProcessor
    # where AutoProcessor looks the saved name "PixtralProcessor" up: the lazy package, which would otherwise hand
    # out a placeholder that asks for torchvision
    importlib.import_module(_PIXTRAL).PixtralProcessor = cls
    return cls


IMAGE_ONLY = {cls.__name__: cls for cls in (LlavaOnevisionProcessorImageOnly, InternVLProcessorImageOnly,
                                            Qwen3VLProcessorImageOnly, Glm4vProcessorImageOnly,
                                            SmolVLMProcessorImageOnly, Gemma4ProcessorImageOnly)}
_CONFIGS = ((LlavaOnevisionConfig, LlavaOnevisionProcessorImageOnly), (InternVLConfig, InternVLProcessorImageOnly),
            (Glm4vConfig, Glm4vProcessorImageOnly), (SmolVLMConfig, SmolVLMProcessorImageOnly),
            (Gemma4Config, Gemma4ProcessorImageOnly),
            (Qwen3_5Config, Qwen3VLProcessorImageOnly), (Qwen3_5MoeConfig, Qwen3VLProcessorImageOnly),
            (Qwen3VLMoeConfig, Qwen3VLProcessorImageOnly))


def register_image_only() -> None:
    """Idempotent. Where torchvision is missing: the image-only processors registered with ``AutoProcessor`` and
    ``PixtralProcessor`` made importable."""
    if has_torchvision():
        return
    pixtral_processor()
    for config, cls in _CONFIGS:
        AutoProcessor.register(config, cls, exist_ok=True)
