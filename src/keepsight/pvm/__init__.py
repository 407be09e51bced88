"""Persistent Visual Memory: the released bottleneck block (default) or our earlier branch, beside the FFN of chosen
decoder layers, reading only the visual embeddings."""

from .attach import (
    Memory,
    attach_pvm,
    build_block,
    detach_pvm,
    gate_report,
    pvm_disabled,
    pvm_memory,
    pvm_parameters,
)
from .block import PVMMemoryBlock
from .config import RELEASED_LAYERS, PVMConfig, strided_layers
from .io import load_pvm, save_pvm
from .module import PVMBranch

__all__ = ["RELEASED_LAYERS", "Memory", "PVMBranch", "PVMConfig", "PVMMemoryBlock", "attach_pvm", "build_block",
           "detach_pvm", "load_pvm", "pvm_disabled", "pvm_memory", "pvm_parameters", "gate_report", "save_pvm",
           "strided_layers"]
