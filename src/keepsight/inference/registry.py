"""The registry's entries for inference: every package that holds a method, imported so that each registers itself
(keepsight's own: ``keepsight.baselines``' modules, ``keepsight.diffusion``'s MPS, MRS and its sampler's model-side
entry, ``keepsight.pvm`` and ``keepsight.bridge``'s model-side entries; and every module declared under the
``keepsight.methods`` entry point group), and ``none``, the checkpoint as it is. ``Pipeline`` sets the model-side
methods up while loading. The registry itself, and how to add a method, is ``keepsight.methods``."""

from __future__ import annotations

from .. import baselines, bridge, diffusion, pvm  # noqa: F401  (each registers its methods on import)
from ..diffusion.sampler import DIFFUSION_SETTINGS
from ..methods import (
    FAMILIES,
    METHODS,
    MODEL_SIDE,
    STAGES,
    Method,
    build_method,
    get_method,
    load_method_packages,
    method_names,
    register_method,
)

__all__ = ["DIFFUSION_SETTINGS", "FAMILIES", "METHODS", "MODEL_SIDE", "STAGES", "Method", "build_method", "get_method",
           "method_names", "register_method"]

load_method_packages()  # methods from other packages (keepsight's own are imported above, metadata or not)

# the plain checkpoint, as it is (pvm, bridge and diffusion register themselves in their packages)
register_method("none", stage="load", needs="a checkpoint of a supported autoregressive family")
