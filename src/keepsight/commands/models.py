"""``keepsight models``: the architectures keepsight supports and which method and diagnostic runs on each."""

from __future__ import annotations

import json

from ..inference.support import kinds, matrix_markdown, support


def add_parser(sub) -> None:
    g = sub.add_parser("models", help="the supported architectures and which method / diagnostic runs on each")
    g.add_argument("--json", action="store_true", help="the matrix as JSON ({model_type: {column: reason|null}})")
    g.set_defaults(func=run)


def run(args) -> int:
    if args.json:
        print(json.dumps({k: support(k) for k in kinds()}, indent=1))
    else:
        print(matrix_markdown(), end="")
    return 0
