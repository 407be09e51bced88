"""The determinism contract: what a run's numbers depend on besides the code and its request, the settings that
make a run repeat bit for bit, and the provenance recorded beside every cached model and result.

Bit-identical: the same code, the same request, the same package versions, the same CPU kind (machine and the
instruction set torch dispatches to) and the same intra-op thread count. Reductions split over threads add in
another order, so another thread count (or CPU kind, or GPU) trains other weights: equal only within the
intervals the results state. ``configure`` fixes what can be fixed (threads, deterministic algorithms, the
cuBLAS workspace); ``environment`` records the rest, and the world's caches are keyed by it so that a cache made
under other settings is never reused silently.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch
from safetensors import safe_open

from .checks import number
from .cores import DEFAULT_THREADS, free_cores, usable_cores

PACKAGES = ("torch", "transformers", "accelerate", "trl", "peft", "tokenizers", "safetensors", "numpy", "pillow")
SOURCE_ROOT = Path(__file__).resolve().parent


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cpu_vendor() -> str | None:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``; None where the OS does not say): MKL picks its
    matrix-product kernels by vendor as well as by instruction set, so two AVX512 machines of different vendors train
    different bits."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_kind() -> str:
    """The CPU kind bits depend on, as a short name: torch's dispatch capability and the vendor (``avx512-intel``,
    ``avx2-amd``; the capability alone where the vendor is unknown)."""
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(cpu_vendor() or "", None)
    cap = str(torch.backends.cpu.get_cpu_capability()).lower()
    return f"{cap}-{vendor}" if vendor else cap


def environment() -> dict:
    """Everything besides the code and the request that a trained model's bits depend on."""
    return {
        "packages": {p: _version(p) for p in PACKAGES},
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_vendor": cpu_vendor(),
        # oneDNN (convolutions, the exact GELU) picks its kernels by the CPU itself, not by torch's capability: its
        # cap (ONEDNN_MAX_CPU_ISA) and whether torch calls it at all change the bits as the CPU kind does
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
        "mkldnn": torch.backends.mkldnn.enabled,
        "threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }


def configure(threads: int = DEFAULT_THREADS) -> dict:
    """Fix what a bit-identical run needs in this process: ``threads`` intra-op threads, deterministic algorithms
    (an op without a deterministic kernel is an error, not a silent difference), cuBLAS's fixed workspace on a
    GPU. Returns ``environment()``."""
    threads = number("threads", threads, 1, integer=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    return environment()


def resolve_threads(threads: int | str, free: int | None = None) -> int:
    """An intra-op thread count: ``threads`` itself, or for ``"auto"`` the cores free now (``free``, else
    ``free_cores()``), at least 1 and at most torch's own default (the physical cores)."""
    if threads == "auto":
        return max(1, min(free_cores() if free is None else free, torch.get_num_threads()))
    return number("threads", threads, 1, integer=True)


def busy_note(threads: int, free: int | None = None) -> str | None:
    """A warning when ``threads`` exceeds the cores free now (``free_cores``; 1 thread never does), else None. Each
    parallel region waits for its slowest thread, and a thread that shares its core with another process runs a
    fraction of the time: 2 threads beside one busy process train about 3x slower than alone, 1 thread about as fast as
    alone (README, "A busy machine")."""
    free = free_cores() if free is None else free
    cores = usable_cores()
    if threads <= max(free, 1):  # one thread is the least a run can take
        return None
    if free >= cores:
        return (f"{threads} intra-op threads on {cores} cores: the threads share the cores, and the run may be several "
                f"times slower than at --threads {cores}")
    return (f"{threads} intra-op threads, but {free} of the {cores} cores are free (other processes keep the rest busy): "
            f"this run may be several times slower than on idle cores; --threads {max(free, 1)} runs near full speed "
            "beside them (and, where the results are bit-for-bit pinned, trains other bits: README, \"A busy "
            "machine\")")


class configured:
    """``configure`` for a block; the previous thread count and algorithm setting come back on exit."""

    def __init__(self, threads: int = DEFAULT_THREADS):
        self.threads = threads

    def __enter__(self) -> dict:
        self._saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
        return configure(self.threads)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self._saved[0])
        torch.use_deterministic_algorithms(self._saved[1])


def source_digest(root: Path = SOURCE_ROOT) -> str:
    """A hash of keepsight's own source files (every ``.py`` under the package): which code produced a result."""
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def git_commit(root: Path = SOURCE_ROOT) -> dict | None:
    """``{"commit", "dirty"}`` of the git checkout keepsight runs from (None outside one, or without git):
    ``dirty`` when tracked source files differ from the commit."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=top, capture_output=True, text=True, timeout=10,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src"], cwd=top,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def provenance() -> dict:
    """What produced an output: the code (source digest, git commit when there is one) and the environment."""
    return {"source": source_digest(), "git": git_commit(), "environment": environment()}


def weights_digest(directory: str | os.PathLike) -> str:
    """A hash of the tensors in a directory's ``*.safetensors`` files (names, dtypes, shapes and bytes, in name
    order): equal exactly when the weights are bit-identical, whatever the files' metadata."""
    h = hashlib.sha256()
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors files to hash")
    for f in files:
        with safe_open(str(f), "pt") as st:
            for name in sorted(st.keys()):
                t = st.get_tensor(name).contiguous()
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]
