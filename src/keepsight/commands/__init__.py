"""The ``keepsight`` command groups: one module each, with ``add_parser(subparsers)`` and its ``run`` functions."""

from . import bench, bridge, demo, diagnose, diffusion, eval, lora, pvm, world

# the order ``keepsight --help`` lists them
GROUPS = (world, diagnose, pvm, lora, bridge, diffusion, bench, eval, demo)
