"""Tiny checkpoint directories for the tests (``keepsight.world.models.save_tiny_checkpoint``, the same as
``keepsight world tiny``), read back through keepsight's loader."""

from __future__ import annotations

from keepsight.models import load_checkpoint
from keepsight.world.models import save_tiny_checkpoint

__all__ = ["load_vlm", "save_tiny_checkpoint"]


def load_vlm(path):
    """A saved model and its processor as the training commands load them (CPU, the saved dtype)."""
    return load_checkpoint(path, dtype=None, device="cpu")
