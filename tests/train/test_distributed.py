"""Data-parallel training: a command run on 2 processes trains exactly like the same command on 1.

Every training command takes ``--batch-size`` as the *global* batch of one optimizer step; under
``accelerate launch`` it is split into ``batch / (processes x --grad-accum)`` per device
(``keepsight.train.distributed.batch_layout``). What makes the runs comparable:

- data order: the length-grouped sampler (``length_grouped_sampler``) draws its permutation from
  (data seed, epoch) only and groups by the global batch, so every process holds the same index list;
  accelerate's ``BatchSamplerShard`` gives process r every r-th per-device batch, hence the per-device
  batches of one optimizer step are exactly the ``global batch`` consecutive indices the 1-process run
  takes as one batch (checked directly below, without launching anything);
- the loss: the world VLMs accept loss kwargs, so the Trainer passes ``num_items_in_batch`` (the answer
  tokens of the global batch, summed over processes and accumulation steps): each rank's loss is its
  token sum over the global count (times the world size, undone by DDP's gradient averaging), and the
  logged loss is the all-gathered mean, i.e. the token mean over the global batch, the quantity the
  1-process run logs. ``grad_norm`` is taken after DDP's all-reduce: the global batch's gradient norm;
- nothing random in the forward (dropout 0), so the trajectories agree to float rounding (the
  reductions run in a different order): measured ~1e-6 relative on losses, grad norms and weights.

On CPU, ``accelerate launch --cpu`` starts one process whatever ``--num_processes`` says (the simple
launcher); two CPU processes need the torchrun launcher, ``--multi_gpu``, with CUDA hidden so that the
Trainer picks the CPU and gloo. The test asserts the run really had 2 processes (its recorded layout).
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from keepsight.train.distributed import batch_layout, length_grouped_sampler

STEPS, GLOBAL_BATCH = 5, 4


# ----------------------------------------------------------------------------- no launch


def test_batch_layout(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert batch_layout(16) == {"global_batch_size": 16, "world_size": 1, "grad_accum": 1,
                                "per_device_batch_size": 16}
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert batch_layout(16, grad_accum=4)["per_device_batch_size"] == 2
    with pytest.raises(ValueError, match="not divisible by 2 processes x 3"):
        batch_layout(16, grad_accum=3)
    with pytest.raises(ValueError, match="grad_accum"):
        batch_layout(16, grad_accum=0)


def _steps(lengths, global_batch, world, grad_accum, seed=0, epoch=0):
    """The indices behind each optimizer step, as accelerate deals them to ``world`` processes."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    per_device = global_batch // (world * grad_accum)
    per_rank = []
    for rank in range(world):
        sampler = length_grouped_sampler(lengths, global_batch, seed)  # every process builds its own
        sampler.set_epoch(epoch)
        shard = BatchSamplerShard(BatchSampler(sampler, per_device, drop_last=False), num_processes=world,
                                  process_index=rank)
        per_rank.append(list(shard))
    n_steps = len(per_rank[0]) // grad_accum
    return [sorted(i for r in range(world) for b in per_rank[r][s * grad_accum:(s + 1) * grad_accum] for i in b)
            for s in range(n_steps)]


def test_global_batches_do_not_depend_on_the_split():
    lengths = [int(x) for x in torch.randint(3, 60, (96,))]
    one = _steps(lengths, 8, world=1, grad_accum=1)
    assert _steps(lengths, 8, world=2, grad_accum=1) == one
    assert _steps(lengths, 8, world=2, grad_accum=2) == one
    assert _steps(lengths, 8, world=4, grad_accum=1) == one
    assert _steps(lengths, 8, world=1, grad_accum=4) == one
    assert sorted(i for s in one for i in s) == list(range(96))  # one epoch: every item once
    # length-grouped: one step's items have similar lengths (not a random mix)
    spread = sum(max(lengths[i] for i in s) - min(lengths[i] for i in s) for s in one) / len(one)
    assert spread < 0.5 * (max(lengths) - min(lengths))


def test_sampler_order_ignores_the_global_rng():
    """Dropout (or a diffusion objective) advances the global RNG differently on each rank; the data
    order must not follow it, or from the second epoch on the ranks would shard different orders."""
    lengths = list(range(40))
    torch.manual_seed(1)
    a = list(length_grouped_sampler(lengths, 4, seed=0))
    torch.manual_seed(2)
    torch.rand(100)
    assert list(length_grouped_sampler(lengths, 4, seed=0)) == a
    s = length_grouped_sampler(lengths, 4, seed=0)
    s.set_epoch(1)
    assert list(s) != a and sorted(s) == sorted(a)


# ----------------------------------------------------------------------------- launched runs


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from keepsight.cli import main
    from keepsight.world.models import build_model
    from keepsight.world.processor import build_processor

    d = tmp_path_factory.mktemp("base")
    processor = build_processor()
    torch.manual_seed(0)
    build_model("tiny-llava", processor.tokenizer).save_pretrained(d)
    processor.save_pretrained(d)
    assert main(["world", "build", "--out", str(d / "data"), "--n", "6", "--seed", "1"]) == 0
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(processes: int, argv: list[str], log) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--num_processes", str(processes)]
    launch += ["--cpu"] if processes == 1 else ["--multi_gpu", "--main_process_port", str(_free_port())]
    return subprocess.Popen(launch + ["-m", "keepsight.cli", *argv], stdout=log, stderr=subprocess.STDOUT, env=env)


def _run_both(tiny_base, tmp_path, runs: dict[str, tuple[int, list[str]]]) -> dict[str, dict]:
    """Launch the runs side by side (``name: (processes, extra argv)``); returns each run's summary."""
    common = ["pvm", "train", "--stage", "sft", "--model", str(tiny_base), "--data", str(tiny_base / "data"),
              "--steps", str(STEPS), "--batch-size", str(GLOBAL_BATCH), "--seed", "3"]
    procs = {}
    for name, (n, extra) in runs.items():
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        procs[name] = (_launch(n, [*common, "--out", str(tmp_path / name), *extra], log), log)
    for name, (p, log) in procs.items():
        try:
            p.wait(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
            log.close()
        assert p.returncode == 0, f"{name}: " + (tmp_path / f"{name}.log").read_text()[-3000:]
    return {name: json.loads((tmp_path / name / "pvm_train.json").read_text()) for name in runs}


def _per_step(summary: dict, key: str) -> list[float]:
    return [h[key] for h in summary["log_history"] if key in h and "train_runtime" not in h]


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "pvm.safetensors"))


def _compare(ref: dict, other: dict, ref_dir, other_dir) -> float:
    """Largest relative difference between two runs (per-step losses and grad norms, adapter weights)."""
    worst = 0.0
    for key in ("loss", "grad_norm"):
        a, b = _per_step(ref, key), _per_step(other, key)
        assert len(a) == len(b) == STEPS, (key, a, b)
        worst = max(worst, max(abs(x - y) / abs(x) for x, y in zip(a, b)))
    wa, wb = _weights(ref_dir), _weights(other_dir)
    assert wa.keys() == wb.keys()
    for k in wa:
        # relative to the tensor's scale; the gates start at 0, so for them this is relative to the update
        worst = max(worst, (wa[k] - wb[k]).abs().max().item() / wa[k].abs().max().item())
    return worst


def test_ddp_matches_single_process(tiny_base, tmp_path):
    """PVM stage 1 (frozen backbone, only the PVM branch trains), global batch 4 for 5 steps: 1 process x 4
    against 2 gloo processes x 2. Losses, gradient norms and the saved adapter agree to 1e-4 relative
    (measured ~2e-6); a wrong data split shows up at once as a different first loss (~1e-2 off)."""
    s = _run_both(tiny_base, tmp_path, {"single": (1, []), "ddp": (2, [])})
    assert s["single"]["batch_layout"] == {"global_batch_size": 4, "world_size": 1, "grad_accum": 1,
                                           "per_device_batch_size": 4}
    assert s["ddp"]["batch_layout"] == {"global_batch_size": 4, "world_size": 2, "grad_accum": 1,
                                        "per_device_batch_size": 2}
    worst = _compare(s["single"], s["ddp"], tmp_path / "single", tmp_path / "ddp")
    assert worst < 1e-4, worst
    gates = [v.item() for k, v in _weights(tmp_path / "ddp").items() if k.endswith(".gate")]
    assert all(g != 0 for g in gates)  # it did train
    assert not list(tmp_path.glob("ddp/.*tmp*")) and not (tmp_path / "ddp" / "checkpoints").exists()


@pytest.mark.slow
def test_ddp_with_gradient_accumulation_matches(tiny_base, tmp_path):
    """The same global batch as 2 processes x 2 accumulation steps x 1 item."""
    s = _run_both(tiny_base, tmp_path, {"single": (1, []), "ddp_accum": (2, ["--grad-accum", "2"])})
    assert s["ddp_accum"]["batch_layout"]["per_device_batch_size"] == 1
    assert _compare(s["single"], s["ddp_accum"], tmp_path / "single", tmp_path / "ddp_accum") < 1e-4


def test_main_process_writes_reraises_the_writers_error():
    from keepsight.train.distributed import main_process_writes

    done = []
    main_process_writes(done.append, 1)
    assert done == [1]

    def fail():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        main_process_writes(fail)


def test_sampler_reproduces_the_single_process_order_of_earlier_versions():
    """Earlier versions used transformers' LengthGroupedSampler on the global RNG right after the
    Trainer's ``set_seed(seed)``: per epoch the DataLoader drew one int64 base seed, then the sampler one
    permutation. The own-generator sampler yields the same orders (so cached models stay reproducible)."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    lengths = [int(x) for x in torch.randint(3, 60, (200,))]
    torch.manual_seed(7)
    legacy = []
    for _ in range(3):  # three epochs of the old single-process stream
        torch.empty((), dtype=torch.int64).random_()
        legacy.append(list(LengthGroupedSampler(8, lengths=lengths)))
    s = length_grouped_sampler(lengths, 8, seed=7)
    for epoch, order in enumerate(legacy):
        s.set_epoch(epoch)
        assert list(s) == order
