"""Inference: load a checkpoint with a method from the one registry, batch, decode, report the methods' stats.

``Pipeline`` is what ``keepsight eval``, the lmms-eval model, the experiments and the benchmarks decode with;
``METHODS`` / ``register_method`` is the registry every method is listed in once (see ``registry``).
"""

from .pipeline import Generation, Pipeline
from .registry import METHODS, Method, build_method, get_method, method_names, register_method

__all__ = ["Generation", "METHODS", "Method", "Pipeline", "build_method", "get_method", "method_names", "register_method"]
