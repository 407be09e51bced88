"""A self-contained HTML report: tables from ``results.json``, images inlined as base64 PNG."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l{text-align:left}.s{display:flex;gap:12px;align-items:flex-start;margin:8px 0}
.s img{image-rendering:pixelated;width:128px;height:128px}.s p{margin:0;font-size:12px}
code{background:#f5f5f5;padding:1px 3px}
"""


def esc(x) -> str:
    return html.escape(str(x))


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return esc(x)


def md_table(header: list[str], rows: list[list], cell=fmt) -> list[str]:
    """A Markdown table's lines: the header, its rule, and each row's cells as ``cell`` writes them."""
    return (["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
            + ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows])


def table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=l' if i == 0 else ''}>{fmt(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def img_tag(png: bytes, alt: str = "") -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def write_report(path: str | Path, title: str, sections: list[tuple[str, str]], results: dict) -> Path:
    """``sections``: (heading, html body) pairs, in order. The raw results follow at the end."""
    parts = [f"<!doctype html><meta charset=utf-8><title>{esc(title)}</title><style>{STYLE}</style>",
             f"<h1>{esc(title)}</h1>"]
    for heading, body in sections:
        parts.append(f"<h2>{esc(heading)}</h2>{body}")
    raw = json.dumps(results, indent=1, default=str)
    parts.append(f"<details><summary>results.json</summary><pre>{esc(raw)}</pre></details>")
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(parts))
    tmp.replace(path)
    return path
