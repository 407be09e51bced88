"""Safe outputs: atomic writes (a reader never sees half a file or directory), checks that an output path can
be written *before* any work starts, and the marker that says a directory was written by keepsight (so that
``--overwrite`` only ever replaces keepsight's own outputs, never a user's files)."""

from __future__ import annotations

import atexit
import glob
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
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
    return _write_through_temp(path, json.dumps(obj, indent=2))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a sibling temporary file (removed if the write fails)."""
    return _write_through_temp(Path(path), text)


def _write_through_temp(path: Path, text: str) -> Path:
    """Write ``text`` to a fresh hidden sibling of ``path`` (``.<name>.<random>.tmp``: never a name a user's file
    could hold), then rename it over ``path``."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, _MODE & 0o666)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def mark(directory: str | os.PathLike, kind: str) -> None:
    """Record in ``directory`` that keepsight wrote it, as a ``kind`` (world, model, adapter, run, ...)."""
    _write_through_temp(Path(directory, MARKER), json.dumps({"kind": kind}))  # never a zero-byte marker (full disk)


def marked_kind(directory: str | os.PathLike) -> str | None:
    """The kind keepsight recorded in ``directory``, or None when it holds no (readable) marker."""
    try:
        return json.loads(Path(directory, MARKER).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def atomic_save_dir(out: str | os.PathLike, write, kind: str | None = None) -> Path:
    """Call ``write(tmpdir)`` then put tmpdir in ``out``'s place (replacing it): readers never see a half dir. With
    ``kind``, the new directory carries keepsight's marker. On any error or signal the temporary directory is
    removed and ``out`` is left as it was.

    The publish never deletes before it has replaced: the finished directory is renamed ``.<out>.new-*``, the old
    ``out`` (if any) ``.<out>.old-*``, the new one ``out``, and only then is the old one deleted. The renames run with
    SIGTERM / SIGHUP / SIGINT held back in this thread; a signal another thread takes in between (the handler raises)
    rolls them back to the old output. A process killed (SIGKILL) in between leaves the old or the new output whole
    under one of those names, and the next run on ``out`` puts it back (``recover_output``).

    Ownership is checked again at the moment of the replacement: ``out`` must be absent, an empty directory, or
    keepsight's own output of the same ``kind``. Anything else (a directory or file a user made while the work
    ran) is left untouched, the new output is kept beside it and a ValueError says where."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out.parent, f".{out.name}.tmp-")
    try:
        write(tmp)
        if kind is not None:
            mark(tmp, kind)
        use_umask(tmp)
        problem = _not_replaceable(out, kind)
        if problem:
            kept = _keep_beside(tmp, out)
            raise ValueError(f"{out} {problem}; it was left as it is and the new output was written to {kept}")
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def replace_dir(src: Path, out: Path, kind: str) -> Path:
    """Put the finished directory ``src`` (a sibling of ``out``, named ``.<out>.<what>-<tag>``) in ``out``'s place the
    way ``atomic_save_dir`` does: ``out`` must be absent, empty, or keepsight's output of ``kind``."""
    problem = _not_replaceable(out, kind)
    if problem:
        raise ValueError(f"{out} {problem}; it was left as it is and the new output is in {src}")
    mark(src, kind)
    _swap_in(src, out)
    return out


_HELD = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` into ``out``'s place (see ``atomic_save_dir``): at every instant ``out`` or one of
    its ``.new-`` / ``.old-`` siblings is whole."""
    tag = tmp.name.rsplit("-", 1)[-1]
    new, old = out.with_name(f".{out.name}.new-{tag}"), out.with_name(f".{out.name}.old-{tag}")
    held = threading.current_thread() is threading.main_thread()
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        os.replace(tmp, new)
        try:
            if out.is_dir() and not out.is_symlink():
                os.replace(out, old)
            os.replace(new, out)
        except BaseException:
            if old.exists() and not out.exists():
                os.replace(old, out)
            if new.exists():
                os.replace(new, tmp)  # the caller removes it
            raise
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    shutil.rmtree(old, ignore_errors=True)


def recover_output(out: str | os.PathLike) -> None:
    """Finish or undo a publish of ``out`` that a killed process left (``atomic_save_dir``): when ``out`` is missing,
    the newest finished ``.<out>.new-*`` (else the newest ``.<out>.old-*``) becomes ``out`` again; the other
    leftovers (old outputs, unfinished ``.<out>.tmp*`` directories, ``.<out>.*.tmp`` files) are removed. Call it
    only while holding ``out`` (``lock_output``): another live run's temporary files look the same."""
    out = Path(out)
    parent, name = out.parent, glob.escape(out.name)
    if not parent.is_dir():
        return
    by_age = lambda pattern: sorted(parent.glob(pattern), key=lambda p: p.stat().st_mtime)  # noqa: E731
    news, olds = by_age(f".{name}.new-*"), by_age(f".{name}.old-*")
    if not out.exists() and not out.is_symlink() and (news or olds):
        keep = (news or olds)[-1]
        os.replace(keep, out)
        (news if news and keep == news[-1] else olds).pop()
    leftovers = news + olds + list(parent.glob(f".{name}.tmp*")) + list(parent.glob(f".{name}.*.tmp"))
    for p in leftovers:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _not_replaceable(out: Path, kind: str | None) -> str | None:
    """Why ``out`` may not be replaced by a new output of ``kind`` now (None: it may)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return "is now a file (not keepsight's output)"
    if not out.exists() or not any(out.iterdir()):
        return None
    found = marked_kind(out)
    if found is None:
        return "now holds files keepsight did not write"
    if kind is not None and found != kind:
        return f"now holds a keepsight {found}, not a {kind}"
    return None


def _keep_beside(tmp: Path, out: Path) -> Path:
    """Rename the finished temporary output to a free sibling name of ``out``."""
    for i in range(1, 1000):
        kept = out.with_name(f"{out.name}.keepsight-{i}")
        if not kept.exists():
            os.replace(tmp, kept)
            return kept
    raise ValueError(f"no free name beside {out} to keep the new output in")


# ----------------------------------------------------------------------------- files keepsight wrote

def _sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}{MARKER}")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mark_file(path: str | os.PathLike, kind: str) -> None:
    """Record beside the file ``path`` (a hidden ``.<name>.keepsight``) that keepsight wrote it, with its hash: a
    later edit by the user makes it the user's file again."""
    path = Path(path)
    write_json(_sidecar(path), {"kind": kind, "sha256": _digest(path)})


def owned_file(path: str | os.PathLike) -> bool:
    """Whether the file ``path`` is keepsight's output, unchanged since keepsight wrote it."""
    return file_kind(path) is not None


def file_kind(path: str | os.PathLike) -> str | None:
    """The kind keepsight recorded for the file ``path`` (``mark_file``), or None when it is not keepsight's output
    or was changed since keepsight wrote it."""
    path = Path(path)
    try:
        record = json.loads(_sidecar(path).read_text())
        return str(record.get("kind")) if record.get("sha256") == _digest(path) else None
    except (OSError, ValueError, AttributeError):
        return None


def write_output_text(path: str | os.PathLike, text: str, kind: str) -> Path:
    """``write_text`` for a command's ``--out`` file, marked as keepsight's (see ``mark_file``)."""
    path = write_text(path, text)
    mark_file(path, kind)
    return path


def write_output_json(path: str | os.PathLike, obj, kind: str) -> Path:
    """``write_json`` for a command's ``--out`` file, marked as keepsight's (see ``mark_file``)."""
    path = write_json(path, obj)
    mark_file(path, kind)
    return path


# ----------------------------------------------------------------------------- one writer per output

_LOCKS: dict[Path, Path] = {}  # output -> its lock file, held by this process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_output(path: str | os.PathLike, name: str = "--out") -> bool:
    """Hold ``path`` for this process (a hidden ``.keepsight-lock-<hash of the path>`` file in its nearest existing
    directory) until ``release_outputs`` or exit: a second run writing the same output at once is refused, not both "successful". A lock whose
    process is gone is taken over."""
    path = Path(path).resolve()  # every spelling of one output (symlinked parents, "..") takes the same lock
    if path in _LOCKS:
        return True
    if int(os.environ.get("RANK", 0)) != 0:
        return False  # another rank of a multi-process run (`accelerate launch`): rank 0 holds it
    home = path.parent
    while not home.is_dir() and home != home.parent:  # nothing is created before the work starts
        home = home.parent
    if not os.access(home, os.W_OK | os.X_OK):
        return False  # an unwritable place: the write itself reports it
    lock = home / f".{MARKER.lstrip('.')}-lock-{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid == os.getpid():
                _LOCKS[path] = lock
                return True
            if pid and _alive(pid):
                raise ValueError(f"{name} {path} is being written by another keepsight run (process {pid}); wait for "
                                 f"it to finish or choose another output") from None
            lock.unlink(missing_ok=True)  # its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        _LOCKS[path] = lock
        return True
    return False


def release_outputs() -> None:
    """Release every output this process holds (the end of a command)."""
    for path, lock in list(_LOCKS.items()):
        try:
            if int(lock.read_text().strip() or 0) == os.getpid():
                lock.unlink()
        except (OSError, ValueError):
            pass
        _LOCKS.pop(path, None)


atexit.register(release_outputs)


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


def _inside(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` (resolved) lies in the directory ``outer`` (resolved), or is it."""
    try:
        return Path(inner).resolve().is_relative_to(Path(outer).resolve())
    except OSError:
        return False


def check_output_file(path: str | os.PathLike, name: str = "--out", inputs: Iterable = (),
                      overwrite: bool = False, kind: str | None = None) -> Path:
    """``path`` can be written as a file: not an existing directory, not one of ``inputs``, under a writable
    directory, and, if it exists, keepsight's own unchanged output (``owned_file``) unless ``overwrite``; with
    ``kind``, a keepsight file of another kind (predictions where scores would go) is refused even with
    ``overwrite``. Raise a ValueError naming ``name`` otherwise (before any work starts); the output is then held by
    this process (``lock_output``) and what an interrupted write left beside it is removed (``recover_output``)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name} {path} is a directory; it must name a file")
    for src in inputs:
        if src is not None and _same(path, Path(src)):
            raise ValueError(f"{name} {path} is also an input of this command; writing it would destroy the input")
    _writable_parent(path, name)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{name} {path} is not writable")
    found = file_kind(path) if path.exists() else None
    if found is not None and kind is not None and found != kind:
        raise ValueError(f"{name} {path} is a keepsight {found} file, not {kind}; refusing to replace it (choose "
                         "another name)")
    if path.exists() and not overwrite and found is None:
        raise ValueError(f"{name} {path} exists and is not an output of keepsight's (or was edited since); refusing "
                         "to replace it (choose another name, or pass --overwrite)")
    if lock_output(path, name):
        recover_output(path)
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
        if src is not None and path.is_dir() and _inside(Path(src), path):
            raise ValueError(f"{name} {path} holds {src}, an input of this command: writing the output replaces the "
                             "directory and would destroy it (choose another output directory, or move the input)")
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
    if lock_output(path, name):
        recover_output(path)
    return path
