"""Persistent Visual Memory: the released bottleneck block beside the FFN of chosen decoder layers, reading only the
visual embeddings (our earlier reading, a branch, is ``keepsight.pvm.readings``)."""

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

__all__ = ["RELEASED_LAYERS", "Memory", "PVMConfig", "PVMMemoryBlock", "attach_pvm", "build_block",
           "detach_pvm", "load_pvm", "pvm_disabled", "pvm_memory", "pvm_parameters", "gate_report", "save_pvm",
           "strided_layers"]
