"""Explicit registration of keepsight's model types with transformers' Auto classes (never an import
side effect): ``llada`` (the masked-diffusion LM, ``keepsight.models.llada``), ``lavida`` (LaViDa,
``keepsight.models.lavida``) and ``keepsight_llava`` (a LLaVA
whose projector is a keepsight bridge, ``keepsight.bridge.swap``), and the image-only processors of families
whose own need torchvision (``keepsight.models.image_only``). The loader and the tiny builders call it;
call it yourself before ``AutoModel*.from_pretrained`` on such a directory outside keepsight's loader."""

from __future__ import annotations

from ..bridge.swap import register_bridged_llava
from .image_only import register_image_only
from .lavida import register_lavida
from .llada import register_llada


def register_model_types() -> None:
    """Idempotent."""
    register_llada()
    register_bridged_llava()
    register_image_only()
    register_lavida()
