"""Inference: load a checkpoint with a method from the one registry, batch, decode, report the methods' stats.

``Pipeline`` is what ``keepsight eval`` and the lmms-eval model decode with; ``Decoders`` applies decoding methods
by name around any decoding loop (the Pipeline's, the world experiments' and the benchmarks'); ``METHODS`` /
``register_method`` is the registry every method is listed in once (``keepsight.methods``).
"""

from .decoders import Decoders
from .pipeline import Generation, Pipeline
from .registry import METHODS, Method, build_method, get_method, method_names, register_method

__all__ = ["Decoders", "Generation", "METHODS", "Method", "Pipeline", "build_method", "get_method", "method_names", "register_method"]
