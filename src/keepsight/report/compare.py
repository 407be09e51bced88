"""Compare two renderings of a run's ``results.md`` (the published one and a fresh run's) number by number:
which numbers moved, where, and from what to what, and which lines the fresh run adds (a measure the published run
did not yet report). Timing columns (seconds, time per token, speed-ups) and the
provenance line are left out: they differ between runs that computed the same thing."""

from __future__ import annotations

import difflib
import re

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+|\d+)(?:e[-+]?\d+)?%?")
TIMING = re.compile(r"second|time|\bms\b|speed|latency|\bs\b|\bmin\b|minutes|\(s\)|/ ?s\b", re.IGNORECASE)
PROVENANCE = "Produced by "


def _skeleton(line: str) -> str:
    return NUMBER.sub("#", line)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_separator(line: str) -> bool:
    return line.lstrip().startswith("|") and set(line.replace("|", "").split()) <= {"---", ":---", "---:", ":---:"}


def _annotate(lines: list[str]) -> list[tuple[str, str, list[bool] | None]]:
    """Each line with a label (the section heading and the row's first cell) and, in a table row, which of its
    cells are timings (by the column header)."""
    out, heading, header = [], "", None
    for i, line in enumerate(lines):
        if line.startswith("#"):
            heading, header = line.lstrip("#").strip(), None
        is_row = line.lstrip().startswith("|")
        if is_row and i + 1 < len(lines) and _is_separator(lines[i + 1]):
            header = _cells(line)
        if not is_row:
            header = None if line.strip() else header
        timing = [bool(TIMING.search(h)) for h in header] if is_row and header is not None else None
        label = f"{heading} / {_cells(line)[0]}" if is_row else heading
        out.append((line, label, timing))
    return out


def _numbers(line: str, timing: list[bool] | None) -> list[str]:
    if timing is None:
        return NUMBER.findall(line) if not TIMING.search(line) else [n for n in NUMBER.findall(line)
                                                                     if not _timed_in_prose(line, n)]
    found = []
    for cell, is_time in zip(_cells(line), timing + [False] * len(_cells(line))):
        if not is_time:
            found += NUMBER.findall(cell)
    return found


def _timed_in_prose(line: str, number: str) -> bool:
    """A number in prose followed by a time unit ("21 s", "2.5 min")."""
    return re.search(re.escape(number) + r"\s*(?:s|min|minutes|seconds|ms)\b", line) is not None


def compare_numbers(published: str, fresh: str) -> tuple[list[str], list[str]]:
    """``(moved, added)``: every number of ``published`` that ``fresh`` prints differently (or no longer prints), as
    readable lines (empty when the two agree on every number outside the timing columns); and the lines with numbers
    that only ``fresh`` prints where ``published`` has nothing in their place (a row or table added since the published
    run: new, not moved; a changed row's new form counts with the moved)."""
    a = [ln for ln in published.splitlines() if not ln.startswith(PROVENANCE)]
    b = [ln for ln in fresh.splitlines() if not ln.startswith(PROVENANCE)]
    ann_a, ann_b = _annotate(a), _annotate(b)
    moved: list[str] = []
    added: list[str] = []
    matcher = difflib.SequenceMatcher(a=[_skeleton(x) for x in a], b=[_skeleton(x) for x in b], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for (la, label, timing), (lb, _, _) in zip(ann_a[i1:i2], ann_b[j1:j2]):
                na, nb = _numbers(la, timing), _numbers(lb, timing)
                changes = [f"{x} -> {y}" for x, y in zip(na, nb) if x != y]
                if changes:
                    moved.append(f"{label}: {', '.join(changes)}")
            continue
        for la, label, timing in ann_a[i1:i2]:
            if _numbers(la, timing):
                moved.append(f"{label}: only in the published results: {la.strip()}")
        for lb, label, timing in ann_b[j1:j2]:  # inserted lines are new; a replaced line's new form moved with it
            if _numbers(lb, timing):
                (added if op == "insert" else moved).append(f"{label}: only in the fresh run: {lb.strip()}")
    return moved, added
