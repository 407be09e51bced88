"""Training-free grounding baselines behind one API, on today's Hugging Face classes (LLaVA-family, Qwen3-VL,
Qwen2.5-VL): VCD, PAI, MemVR, DeCo, OPERA. Each is a config dataclass with its released code's defaults and a method
object whose ``apply(model)`` context manager installs everything (hooks, an attention function; OPERA: its beam
search in place of ``model.generate``) and removes it on exit;
``stats()`` says how often it acted. Combine with PVM where both apply: PVM is part of the model (an adapter), so
any baseline can run on a PVM model; baselines are not stacked on one another (``apply`` refuses nothing, but the
results of two logit-level methods together are not what either paper measured).

    from keepsight.baselines import build_baseline
    vcd = build_baseline("vcd", alpha=1.0)
    with vcd.apply(model):
        ids = model.generate(**inputs, max_new_tokens=64)
    print(vcd.stats())
"""

from ..methods import METHODS
from .base import Baseline, Stats
from .deco import DeCo, DeCoConfig
from .memvr import MemVR, MemVRConfig
from .opera import OPERA, OPERAConfig
from .pai import PAI, PAIConfig
from .vcd import VCD, VCDConfig, alpha_bar, distort

# name -> (class, config) of the baselines above, each registered by its module (``keepsight.methods``)
BASELINES = {name: (METHODS[name].build, METHODS[name].config) for name in ("vcd", "pai", "memvr", "deco", "opera")}


def build_baseline(name: str, **settings) -> Baseline:
    """A baseline by name with its settings (the config's fields); unknown names / fields are ValueErrors."""
    if name not in BASELINES:
        raise ValueError(f"unknown method {name!r}; choose from {sorted(BASELINES)}")
    cls, config = BASELINES[name]
    try:
        return cls(config(**settings))
    except TypeError as e:
        raise ValueError(f"{name}: {e}") from None


__all__ = ["BASELINES", "Baseline", "DeCo", "DeCoConfig", "MemVR", "MemVRConfig", "OPERA", "OPERAConfig", "PAI",
           "PAIConfig", "Stats", "VCD", "VCDConfig", "alpha_bar", "build_baseline", "distort"]
