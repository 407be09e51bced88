"""Self-contained ``keepsight`` subcommands, each with ``add_parser(subparsers)`` and ``run(args)``."""
