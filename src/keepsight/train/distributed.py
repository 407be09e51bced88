"""How the training commands run across processes (``accelerate launch``: DDP, DeepSpeed ZeRO-2, FSDP2)
and with which precision / device: ranks and barriers, rank-0 writes, FSDP2 gathering for saves, the
global-batch layout and the length-grouped sampler every process draws the same order from.
Single-process runs go through the same functions (they reduce to no-ops there)."""

from __future__ import annotations

import contextvars
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices


def process_rank() -> tuple[int, int]:
    """(rank, world size) of this process: from torch.distributed once it is initialised, else from the
    launcher's environment (``accelerate launch`` / torchrun set ``RANK`` and ``WORLD_SIZE``); (0, 1) alone."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def is_main_process() -> bool:
    return process_rank()[0] == 0


def wait_for_everyone() -> None:
    """Barrier across the processes of a distributed run (no-op in a single process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def main_process_writes(write, *args) -> None:
    """Only the main process calls ``write(*args)`` (outputs are written once, not raced by every rank);
    the others wait for it, so that every process can read the result afterwards. If the main process's
    write fails, it raises that error and every other process raises a RuntimeError saying so (instead
    of failing later on a missing file)."""
    error = None
    if is_main_process():
        try:
            write(*args)
        except BaseException as e:  # re-raised below, after the others have been told
            error = e
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = [error is None]
        dist.broadcast_object_list(flag, src=0)
        if error is None and not flag[0]:
            raise RuntimeError("the main process failed to write its outputs (see its error)")
    if error is not None:
        raise error


def _fsdp_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def gather_state_dict(root: nn.Module, prefix: str = "") -> dict | None:
    """For saving after FSDP2 training; call it on every process. When ``root``'s parameters are sharded
    (FSDP2 DTensors) the full state dict, gathered onto the main process (empty on the others), keeping
    the entries under ``prefix`` with the prefix removed (``"tower."`` for a submodule); None when they are
    whole (1 process, DDP, ZeRO-2): ``save_pretrained(state_dict=None)`` then reads the model itself."""
    if not _fsdp_sharded(root):
        return None
    sd = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def unshard_root(model: nn.Module) -> None:
    """For saving after FSDP2 training; call it on every process. Gathers the root FSDP group (everything
    not inside an auto-wrapped layer, e.g. the PVM branches under ``model.pvm``): until the next forward,
    ``model.named_parameters()`` then yields whole tensors there. No-op without FSDP2."""
    if isinstance(model, FSDPModule):
        model.unshard()


FSDP_WRAP_ENV = "FSDP_TRANSFORMER_CLS_TO_WRAP"
_LAUNCHER_FSDP_WRAP = os.environ.get(FSDP_WRAP_ENV)  # set by the accelerate config (fsdp_transformer_layer_cls_to_wrap)


def fsdp_wrap_classes(model: nn.Module) -> list[str]:
    """The layer classes FSDP's transformer auto-wrap should shard one by one: those the model and its
    sub-models declare in ``_no_split_modules`` (decoder / encoder layers) that it actually contains.
    Accelerate's own default (the top model's ``_no_split_modules``) names classes a LLaVA does not hold
    (``CLIPTextEmbeddings``) and stops; a bare ``nn.Module`` (the vision stage) declares none."""
    declared: set[str] = set()
    present: set[str] = set()
    for m in model.modules():
        declared.update(getattr(m, "_no_split_modules", None) or ())
        present.add(type(m).__name__)
    return sorted(declared & present)


def set_fsdp_wrap(model: nn.Module) -> None:
    """Under ``accelerate launch --config_file configs/accelerate/fsdp.yaml`` (which names no classes),
    point the FSDP plugin (built from the environment when the Trainer creates its Accelerator) at this
    model's layer classes; a class list given in the accelerate config wins."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true" or _LAUNCHER_FSDP_WRAP:
        return
    classes = fsdp_wrap_classes(model)
    if classes:
        os.environ[FSDP_WRAP_ENV] = ",".join(classes)
    else:
        os.environ.pop(FSDP_WRAP_ENV, None)


PRECISIONS = ("no", "bf16", "fp16")
_LAUNCH: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar("keepsight_launch", default=("no", "auto"))


@contextmanager
def launch_options(precision: str = "no", device: str = "auto"):
    """How the training commands inside the block place and run their models (``--precision``, ``--device``;
    not part of any cache key): ``precision`` "bf16" / "fp16" trains with autocast mixed precision over
    fp32 master weights (the Trainer's ``bf16`` / ``fp16``); ``device`` "cpu" forces the CPU, "auto" /
    "cuda" use the GPU of each process when there is one (``accelerate launch`` assigns them)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"training --device must be auto, cpu or cuda (accelerate places each process), got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but CUDA is not available here; use --device cpu (or auto)")
    if precision == "fp16" and (device == "cpu" or not torch.cuda.is_available()):
        raise ValueError("fp16 mixed precision needs a GPU (accelerate ignores it on the CPU); use --precision "
                         "bf16 on the CPU")
    token = _LAUNCH.set((precision, device))
    ok = False
    try:
        yield
        ok = True
    finally:
        _LAUNCH.reset(token)
        close_process_group(wait=ok)


def close_process_group(wait: bool = True) -> None:
    """Tear down the process group a distributed run opened (the Trainer's Accelerator opens it and never
    closes it): a gloo group left to the interpreter's exit can abort one rank ("terminate called without
    an active exception") after the work is done, failing the launch. ``wait``: first a barrier, so no
    rank leaves while another still talks (skipped after an error, where the others may never arrive).
    No-op in a single process."""
    if dist.is_available() and dist.is_initialized():
        try:
            if wait:
                dist.barrier()
        finally:
            dist.destroy_process_group()


def trainer_placement() -> dict:
    """``TrainingArguments`` / ``GRPOConfig`` fields for the current ``launch_options``."""
    precision, device = _LAUNCH.get()  # (precision, device)
    use_cpu = device == "cpu" or not torch.cuda.is_available()
    return {"use_cpu": use_cpu, "bf16": precision == "bf16", "fp16": precision == "fp16"}


def batch_layout(global_batch: int, grad_accum: int = 1) -> dict:
    """How a global batch (the samples behind one optimizer step, what every recipe here specifies) is
    split: ``global_batch = per_device_batch_size * world_size * grad_accum``, over the processes of this
    run. Losses that average over the Trainer's global token count (the world VLMs') then train the same
    way on 1 process or on 8; the masked-diffusion objective averages per micro-batch and draws its masks
    per process, so there the split changes the weighting slightly."""
    world = process_rank()[1]
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    if global_batch % (world * grad_accum):
        raise ValueError(f"batch size {global_batch} is not divisible by {world} processes x {grad_accum} "
                         "gradient-accumulation steps; the batch size is the global batch per optimizer step")
    return {"global_batch_size": global_batch, "world_size": world, "grad_accum": grad_accum,
            "per_device_batch_size": global_batch // (world * grad_accum)}


def length_grouped_sampler(lengths, global_batch: int, seed: int):
    """``transformers``' LengthGroupedSampler, made safe for data parallelism: its permutations come from a
    generator of its own, never from the global RNG (which dropout or a diffusion objective advance
    differently on every rank, so the ranks would shard different orders), and it groups by the *global*
    batch: each run of ``global_batch`` consecutive indices is one optimizer step, which accelerate deals
    out to the processes (process r takes every r-th per-device batch).

    The stream is the one a single-process Trainer used to draw from the global RNG right after
    ``set_seed(seed)`` when the run did not consume randomness itself: per epoch one int64 (the
    DataLoader's base seed) then one permutation. Epoch e's order is recomputed from the start of that
    stream, so it is the same on every rank and after a resume; single-process runs of the world stages
    reproduce the orders (and models) of earlier keepsight versions."""
    class EpochLengthGroupedSampler(LengthGroupedSampler):
        def __init__(self):
            super().__init__(global_batch, lengths=list(lengths))
            self.seed, self.epoch, self._iters, self._epoch_given = seed, 0, 0, False

        def set_epoch(self, epoch: int) -> None:  # called by the Trainer / accelerate at each epoch
            self.epoch, self._epoch_given = epoch, True

        def __iter__(self):
            epoch = self.epoch if self._epoch_given else self._iters
            self._iters += 1
            g = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch + 1):
                torch.empty((), dtype=torch.int64).random_(generator=g)  # the DataLoader's base seed
                order = get_length_grouped_indices(self.lengths, self.batch_size, generator=g)
            return iter(order)

    return EpochLengthGroupedSampler()
