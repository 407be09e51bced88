"""The one recipe skeleton every training run follows: load -> freeze by name -> train -> summarise -> publish.

A ``Recipe`` says what differs (which model, which parameters train, the data, how the output is written);
``run_recipe`` does the rest the same way for all of them:

- the output directory is checked before anything loads: it must be new, empty, or keepsight's own output of
  this kind (``keepsight.atomic``), never a directory of the user's;
- the *request* (the recipe, its options and fingerprints of its model and data) is recorded in the output; an
  existing output (or an unfinished run's checkpoints) made from another request is refused with the fields
  that differ, unless ``overwrite`` (``--overwrite``) replaces it; the same request returns the published
  summary at once (or resumes from the Trainer checkpoints);
- it returns None when ``stop_after`` ended the run before its last step, and otherwise writes the output
  atomically from the main process (under ``accelerate launch`` too) with the common summary fields: ``request``,
  ``train`` (the options), ``batch_layout``, ``first_loss``, ``last_loss``, ``provenance`` (the code and environment
  that trained it, ``keepsight.determinism``, and when it finished), ``log_history``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..atomic import MARKER, atomic_save_dir, check_output_dir, mark, marked_kind, write_json
from ..determinism import provenance
from ..fingerprint import differences
from .distributed import batch_layout, gather_state_dict, main_process_writes, wait_for_everyone
from .trainer import TrainOptions, last_complete_checkpoint, run_trainer


@dataclass
class Run:
    """Where and how one ``run_recipe`` call runs (set on the recipe before ``load``)."""

    out: Path
    stop_after: int | None = None  # end after this global step (resumable), None: run to the end
    progress: bool = True
    grad_accum: int = 1


class Recipe(ABC):
    """Override ``load``, ``dataset`` and ``collator``; the others have defaults. ``options`` is the recipe's config (a
    ``TrainOptions``); ``summary_file`` names the summary written beside the output, ``marker_file`` the file
    whose presence (with the summary) says the output is complete."""

    summary_file = "train_summary.json"
    marker_file = "config.json"
    kind = "model"  # what the output is (keepsight's marker in it; an existing output of another kind is refused)

    def __init__(self, options: TrainOptions):
        self.options = options
        self.run: Run | None = None  # set by run_recipe

    # ------------------------------------------------------------------ what differs
    def request(self) -> dict:
        """What determines the output besides the options (fingerprints of the model and data it is made from)."""
        return {}

    @abstractmethod
    def load(self) -> tuple[nn.Module, object]:
        """The model to train and its processor (or tokenizer)."""

    def trainable(self, name: str) -> bool:
        """Whether the parameter called ``name`` trains (default: every one)."""
        return True

    @abstractmethod
    def dataset(self, processor):
        """The training dataset (items the collator reads; ``.lengths`` for length-grouped batches)."""

    @abstractmethod
    def collator(self, processor):
        """Items -> model inputs."""

    def optimizer_fn(self):
        """``model -> optimizer``, or None for the Trainer's AdamW."""
        return None

    def trainer_module(self, model: nn.Module) -> nn.Module:
        """The module the Trainer trains (a wrapper that computes the objective, or the model itself)."""
        return model

    def before(self, model: nn.Module, processor) -> dict:
        """Summary fields measured before training (e.g. a branch's gate and norm report)."""
        return {}

    def checkpoint_dir(self) -> Path:
        """Where the Trainer's periodic checkpoints go while the run is unfinished."""
        return self.run.out / "checkpoints"

    def fit(self, model: nn.Module, processor) -> tuple[list[dict], int]:
        """Train (resuming from ``checkpoint_dir()``); returns (log history, global step)."""
        run = self.run
        return run_trainer(self.trainer_module(model), self.dataset(processor), self.collator(processor),
                           self.options, self.checkpoint_dir(), run.stop_after, run.progress, self.optimizer_fn(),
                           run.grad_accum)

    def summarise(self, model: nn.Module, processor, logs: list[dict]) -> dict:
        """The recipe's own summary fields (after training)."""
        return {}

    def publish(self, model: nn.Module, processor, out: Path, summary: dict) -> None:
        """Write the output (default: ``save_pretrained`` of the model and processor into ``out`` atomically,
        with the summary; the Trainer checkpoints go with the replaced directory)."""
        publish_directory(out, self.summary_file, summary, self.trainer_module(model), _prefix_of(self, model),
                          lambda tmp, sd: (model.save_pretrained(tmp, state_dict=sd), processor.save_pretrained(tmp)),
                          kind=self.kind)

    # ------------------------------------------------------------------ shared
    def published(self, out: Path) -> dict | None:
        """The summary of a complete output in ``out``, or None."""
        if (out / self.summary_file).is_file() and (out / self.marker_file).is_file():
            return json.loads((out / self.summary_file).read_text())
        return None


def _prefix_of(recipe: Recipe, model: nn.Module) -> str:
    """State-dict prefix of ``model`` inside the module the Trainer wrapped (for FSDP gathering)."""
    wrapper = recipe.trainer_module(model)
    if wrapper is model:
        return ""
    for name, module in wrapper.named_modules():
        if module is model:
            return name + "."
    raise ValueError("the trainer module does not contain the model")


def freeze_by_name(model: nn.Module, trainable) -> None:
    """``requires_grad`` = ``trainable(name)`` for every parameter."""
    for name, p in model.named_parameters():
        p.requires_grad = bool(trainable(name))


def losses(logs: list[dict]) -> tuple[float | None, float | None]:
    found = [h["loss"] for h in logs if "loss" in h]
    return (found[0], found[-1]) if found else (None, None)


def publish_directory(out: Path, summary_file: str, summary: dict, state_root: nn.Module, prefix: str, save,
                      cleanup: Path | None = None, kind: str | None = None) -> None:
    """Write ``save(tmpdir, state_dict)`` and the summary into ``out`` atomically from the main process, marked as
    keepsight's ``kind``. ``state_dict`` is the full state gathered from FSDP2 shards (entries under ``prefix``
    of ``state_root``, prefix removed), or None when the parameters are whole. ``cleanup``: a directory
    removed afterwards."""
    sd = gather_state_dict(state_root, prefix)  # on every process; None unless FSDP-sharded

    def write(tmp: Path) -> None:
        save(tmp, sd)
        write_json(tmp / summary_file, summary)

    def publish() -> None:
        atomic_save_dir(out, write, kind=kind)
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)

    main_process_writes(publish)


REQUEST_FILE = "keepsight_request.json"  # an unfinished run's request, beside its checkpoints


def _json_normal(obj):
    return json.loads(json.dumps(obj, default=str))


def prepare_output(recipe: Recipe, out: Path, overwrite: bool) -> dict | None:
    """Check ``out`` against ``recipe``'s request (see the module docstring); the published summary when ``out``
    already holds this request's output, else None (``out`` is then ready: marked, with the request recorded)."""
    done = recipe.published(out)
    if done is not None and marked_kind(out) is None:  # a complete output of an earlier keepsight version
        main_process_writes(mark, out, recipe.kind)
    check_output_dir(out, "--out", kinds=(recipe.kind,))
    request = _json_normal({"recipe": type(recipe).__name__, "options": dataclasses.asdict(recipe.options),
                            **recipe.request()})
    unfinished = out / REQUEST_FILE
    pending = json.loads(unfinished.read_text()) if unfinished.is_file() else None
    if done is not None and done.get("request") in (request, None):  # None: an earlier version's, unrecorded
        return done
    if done is not None and not overwrite:
        diff = "; ".join(differences(done.get("request") or {}, request)[:6]) or "the recorded request is missing"
        raise ValueError(f"--out {out} holds a {recipe.kind} output made from another request ({diff}); pass "
                         "--overwrite (overwrite=True) to replace it, or choose another --out")
    if pending is not None and pending != request:
        if not overwrite and done is None:
            diff = "; ".join(differences(pending, request)[:6])
            raise ValueError(f"--out {out} holds a {recipe.kind} unfinished run (its checkpoints) made from another "
                             f"request ({diff}); pass --overwrite (overwrite=True) to replace it, or choose another --out")
        main_process_writes(_drop_unfinished, out)
    # an output being replaced stays whole in ``out`` until the new one is published over it (its checkpoints train
    # beside it, in out/checkpoints, and go with it)

    def start() -> None:
        out.mkdir(parents=True, exist_ok=True)
        mark(out, recipe.kind)
        write_json(unfinished, request)

    main_process_writes(start)
    wait_for_everyone()
    recipe.request_record = request
    return None


def run_recipe(recipe: Recipe, out, stop_after: int | None = None, progress: bool = True,
               grad_accum: int = 1, overwrite: bool = False) -> dict | None:
    """Run ``recipe`` into ``out`` (see the module docstring). Returns its summary, or None when ``stop_after``
    ended the run early (run again to resume)."""
    out = Path(out)
    fresh = not (out / REQUEST_FILE).is_file()  # this call starts the run (nothing to resume yet)
    existed = out.exists()
    done = prepare_output(recipe, out, overwrite)
    if done is not None:
        return done
    recipe.run = Run(out, stop_after, progress, grad_accum)
    try:
        model, processor = recipe.load()
        freeze_by_name(model, recipe.trainable)
        before = recipe.before(model, processor)
        model.train()
        logs, step = recipe.fit(model, processor)
    except Exception:
        if fresh and last_complete_checkpoint(out / "checkpoints") is None:
            # a run that failed its checks leaves no --out behind (or the output it was to replace, as it was)
            main_process_writes(_discard_start, out, existed, recipe.published(out) is not None)
        raise
    if step < recipe.options.steps:
        return None
    model.eval()
    first, last = losses(logs)
    summary = {"request": recipe.request_record, "train": dataclasses.asdict(recipe.options),
               "batch_layout": batch_layout(recipe.options.batch_size, grad_accum),
               **({"before": before} if before else {}), **recipe.summarise(model, processor, logs),
               "first_loss": first, "last_loss": last, "provenance": {**provenance(), "finished": time.time()},
               "log_history": logs}
    recipe.publish(model, processor, out, summary)
    return summary


def _drop_unfinished(out: Path) -> None:
    """Remove an unfinished run's request and checkpoints from ``out`` (a published output there stays)."""
    (out / REQUEST_FILE).unlink(missing_ok=True)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)


def _discard_start(out: Path, existed: bool, keep_marker: bool = False) -> None:
    """Remove what ``prepare_output`` started in ``out`` (its marker unless ``keep_marker``: an output it was to
    replace is still there; its request and a checkpoint folder without a finished checkpoint), and ``out`` itself
    when this run made it and nothing else is in it."""
    if not keep_marker:
        (out / MARKER).unlink(missing_ok=True)
    _drop_unfinished(out)
    if not existed:
        with contextlib.suppress(OSError):
            out.rmdir()  # only if empty
