"""Write this CPU kind's entry of ``determinism_pins.json``: the weight hashes of the reduced base recipe's stages on
this machine, with the environment they hold for (other kinds' entries are kept). Run
``python tests/determinism_pins.py`` on each CPU kind and say why in the commit."""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from keepsight.determinism import DEFAULT_THREADS, configured  # noqa: E402
from keepsight.world import generate_scenes, world_config  # noqa: E402
from keepsight.world.tasks import WorldSamples  # noqa: E402
from test_determinism import PINS, _pinned_environment, pin_key, stage_hashes  # noqa: E402

if __name__ == "__main__":
    cfg = world_config()
    samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, 48, seed=0))
    with tempfile.TemporaryDirectory() as tmp, configured(DEFAULT_THREADS) as env:
        hashes = stage_hashes(Path(tmp) / "base", samples)
    pins = json.loads(PINS.read_text()) if PINS.is_file() else {}
    pins[pin_key(env)] = {"environment": _pinned_environment(env), "stages": hashes}
    PINS.write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
    print(f"wrote {PINS}: {hashes}")
