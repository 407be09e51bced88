"""Safe outputs: atomic writes (a reader never sees half a file or directory), checks that an output path can
be written *before* any work starts, and the marker that says a directory was written by keepsight (so that
``--overwrite`` only ever replaces keepsight's own outputs, never a user's files)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

MARKER = ".keepsight"  # in every directory keepsight writes: {"kind": ...}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o777 & ~_umask()  # what a directory made by mkdir gets under this process's umask


def use_umask(path: Path) -> None:
    """Give ``path`` (a file, or a directory and everything in it) the modes ``open`` / ``mkdir`` would under this
    process's umask: mkdtemp makes 0700 directories and some writers (safetensors) 0600 files."""
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        os.chmod(p, _MODE if p.is_dir() else _MODE & 0o666)


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory under ``parent`` with the permissions ``mkdir`` would give it (``mkdtemp``'s are 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, _MODE)
    return tmp


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as JSON to ``path`` through a sibling temporary file (removed if the write fails)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=2))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a sibling temporary file (removed if the write fails)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def mark(directory: str | os.PathLike, kind: str) -> None:
    """Record in ``directory`` that keepsight wrote it, as a ``kind`` (world, model, adapter, run, ...)."""
    Path(directory, MARKER).write_text(json.dumps({"kind": kind}))


def marked_kind(directory: str | os.PathLike) -> str | None:
    """The kind keepsight recorded in ``directory``, or None when it holds no (readable) marker."""
    try:
        return json.loads(Path(directory, MARKER).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def atomic_save_dir(out: str | os.PathLike, write, kind: str | None = None) -> Path:
    """Call ``write(tmpdir)`` then rename tmpdir to ``out`` (replacing it): readers never see a half dir. With
    ``kind``, the new directory carries keepsight's marker. On any error or signal the temporary directory is
    removed and ``out`` is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out.parent, f".{out.name}.tmp")
    try:
        write(tmp)
        if kind is not None:
            mark(tmp, kind)
        use_umask(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ----------------------------------------------------------------------------- checks before the work


def _writable_parent(path: Path, name: str) -> None:
    """The nearest existing ancestor of ``path`` is a directory this process can create entries in."""
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{name} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {path}: {parent} is not writable")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == Path(b).resolve()
    except OSError:
        return False


def check_output_file(path: str | os.PathLike, name: str = "--out", inputs: Iterable = ()) -> Path:
    """``path`` can be written as a file: not an existing directory, not one of ``inputs``, under a writable
    directory. Raise a ValueError naming ``name`` otherwise (before any work starts)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name} {path} is a directory; it must name a file")
    for src in inputs:
        if src is not None and _same(path, Path(src)):
            raise ValueError(f"{name} {path} is also an input of this command; writing it would destroy the input")
    _writable_parent(path, name)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{name} {path} is not writable")
    return path


def check_output_dir(path: str | os.PathLike, name: str = "--out", kinds: Iterable[str] = (),
                     inputs: Iterable = (), overwrite: bool | None = None, legacy=None) -> Path:
    """``path`` can become (or be replaced by) an output directory: not a file, not one of ``inputs``, under a
    writable directory, and, if it exists and is not empty, a directory keepsight wrote as one of ``kinds``.
    ``overwrite``: None = the command resumes or checks its own outputs (an owned directory is fine either
    way); False = an existing owned directory is refused too (pass --overwrite to replace it). ``legacy(path)``
    recognises an unmarked output of an earlier keepsight version as owned (the caller then marks it)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {path} is a file; it must name a directory")
    for src in inputs:
        if src is not None and _same(path, Path(src)):
            raise ValueError(f"{name} {path} is also an input of this command; choose another output directory")
    _writable_parent(path, name)
    if path.is_dir() and any(path.iterdir()):
        kinds = tuple(kinds)
        found = marked_kind(path)
        if found is None and legacy is not None and legacy(path):
            found = next(iter(kinds), "output")
        if found is None or (kinds and found not in kinds):
            what = f"a keepsight {found}" if found else "not written by keepsight"
            raise ValueError(f"{name} {path} exists and is {what}; refusing to write into it (choose an empty or "
                             "new directory)")
        if overwrite is False:
            raise ValueError(f"{name} {path} exists (a keepsight {found}); pass --overwrite to replace it")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{name} {path} is not writable")
    return path
