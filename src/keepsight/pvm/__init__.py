"""Persistent Visual Memory: the released bottleneck block (default) or our earlier branch, beside the FFN of chosen
decoder layers, reading only the visual embeddings."""

# The loader (keepsight.models) reads the released layout (.layout), which needs .attach, which needs the
# architecture table: importing keepsight.models first keeps that chain in one direction whichever package a
# program imports first.
from .. import models  # noqa: F401, I001
from .attach import (
    Memory,
    attach_pvm,
    build_block,
    detach_pvm,
    pvm_disabled,
    pvm_memory,
    pvm_parameters,
    gate_report,
)
from .block import PVMMemoryBlock
from .config import RELEASED_LAYERS, PVMConfig, strided_layers
from .io import load_pvm, save_pvm
from .module import PVMBranch

__all__ = ["RELEASED_LAYERS", "Memory", "PVMBranch", "PVMConfig", "PVMMemoryBlock", "attach_pvm", "build_block",
           "detach_pvm", "load_pvm", "pvm_disabled", "pvm_memory", "pvm_parameters", "gate_report", "save_pvm",
           "strided_layers"]
