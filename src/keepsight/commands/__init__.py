"""The ``keepsight`` command groups: one module each, with ``add_parser(subparsers)`` and its ``run`` functions."""

from . import bench, bridge, demo, diagnose, diffusion, eval, lora, models, pvm, world

# the order ``keepsight --help`` lists them
GROUPS = (world, models, diagnose, pvm, lora, bridge, diffusion, bench, eval, demo)
