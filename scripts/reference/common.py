"""What the parity-fixture scripts share (standard library at import: they also run inside the references' venvs)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


def state_digest(state: dict) -> str:
    """sha256 over the sorted state-dict keys, each key's bytes then its tensor's bytes; the first 16 hex digits."""
    import torch

    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def git_commit(path) -> str | None:
    """The HEAD commit of the git checkout (or bare clone) at ``path``; None where it is not one."""
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def read_source(repo, rel: str) -> bytes:
    """The bytes of ``rel`` in a checkout at ``repo``, or at a bare clone's HEAD."""
    if (Path(repo) / rel).is_file():
        return (Path(repo) / rel).read_bytes()
    return subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{rel}"], capture_output=True, check=True).stdout


def ensure_venv(venv, pins) -> Path:
    """The python of the reference's own venv at ``venv`` (never keepsight's), created on first use; ``pins`` are
    installed from the package index unless the venv's record (``keepsight-pins.txt``) already holds them all, so
    two scripts sharing a venv each get what they pin."""
    python, record = Path(venv) / "bin" / "python", Path(venv) / "keepsight-pins.txt"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    have = set(record.read_text().split()) if record.is_file() else set()
    if not set(pins) <= have:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True)
        record.write_text("\n".join(sorted(have | set(pins))) + "\n")
    return python
