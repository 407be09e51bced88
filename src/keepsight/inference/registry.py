"""The registry's entries for inference: every package that holds a method, imported so that each registers itself
(keepsight's own, ``keepsight.baselines``' modules and ``keepsight.diffusion``, and every module declared under the
``keepsight.methods`` entry point group), and the model-side methods, which ``Pipeline`` sets up while loading. The
registry itself, and how to add a method, is ``keepsight.methods``."""

from __future__ import annotations

from .. import baselines, diffusion  # noqa: F401  (each registers its methods on import)
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
from ..pvm import load_pvm

__all__ = ["DIFFUSION_SETTINGS", "FAMILIES", "METHODS", "MODEL_SIDE", "STAGES", "Method", "build_method", "get_method",
           "method_names", "register_method"]

load_method_packages()  # methods from other packages (keepsight's own are imported above, metadata or not)

# the Pipeline settings of the LLaDA-style sampler and its decoding methods: method=diffusion alone takes them
DIFFUSION_SETTINGS = ("mps", "mrs", "decoding", "steps", "gen_length", "block_length", "cfg_scale", "remasking",
                      "sampler")


def _diffusion_checkpoint(spec, kind: str, where) -> None:
    if not spec.loadable:
        raise ValueError(f"{where}: {spec.note}")
    if not spec.vlm:
        raise ValueError(f"{where} is a text-only LLaDA language model; lmms-eval tasks need a VLM (LLaVA with a "
                         "llada text model)")


def _bridged_checkpoint(spec, kind: str, where) -> None:
    if kind != "keepsight_llava":
        raise ValueError(f"method=bridge expects a bridge-converted checkpoint (model_type keepsight_llava, from "
                         f"`keepsight bridge train` or replace_projector + save_pretrained); {where} has model_type "
                         f"{kind!r}")


# the model-side methods (Pipeline sets them up while loading)
register_method("none", stage="load", needs="a checkpoint of a supported autoregressive family")
register_method("pvm", stage="load", needs="a PVM adapter directory (pvm_config.json + pvm.safetensors)",
                takes=("pvm",), requires=("pvm",), attach=lambda model, pipe: load_pvm(model, pipe.pvm_dir))
register_method("bridge", stage="load", needs="a bridge-converted checkpoint (model_type keepsight_llava)",
                check=_bridged_checkpoint)
register_method("diffusion", stage="load", family="diffusion",
                needs="a masked-diffusion VLM (LLaVA with a llada text model, or a LLaDA-V checkpoint)",
                takes=DIFFUSION_SETTINGS, check=_diffusion_checkpoint)
