"""Persistent Visual Memory: a gated latent cross-attention branch beside the FFN of chosen layers."""

from .attach import attach_pvm, detach_pvm, pvm_disabled, pvm_parameters, pvm_report
from .config import PVMConfig, strided_layers
from .io import load_pvm, save_pvm
from .module import PVMBranch

__all__ = ["PVMBranch", "PVMConfig", "attach_pvm", "detach_pvm", "load_pvm", "pvm_disabled", "pvm_parameters", "pvm_report",
           "save_pvm", "strided_layers"]
