"""What the parity-fixture scripts share (standard library at import: they also run inside the references' venvs)."""

from __future__ import annotations

import hashlib


def state_digest(state: dict) -> str:
    """sha256 over the sorted state-dict keys, each key's bytes then its tensor's bytes; the first 16 hex digits."""
    import torch

    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
