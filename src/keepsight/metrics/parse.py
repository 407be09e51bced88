"""Read world descriptions back into mentions (pure stdlib, shared by metrics and the world)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
)
ROW_LETTERS = "abcdefghij"  # cells are named like chess squares: row letter + 1-based column, "b3"
_WORD_NUM = {w: i for i, w in enumerate(NUMBER_WORDS)}
_SCENE_RE = re.compile(r"this is an? (\w+) scene")
_COUNT_RE = re.compile(r"there (?:are|is) (\w+) objects?")
_OBJ_RE = re.compile(r"\bat ([a-z])(\d+) an? (\w+) (\w+) (\w+)")


def place(row: int, col: int) -> str:
    """0-based cell -> its name: (1, 2) -> "b3"."""
    return f"{ROW_LETTERS[row]}{col + 1}"


@dataclass
class Mention:
    """One object as a description names it. ``row``/``col`` are 0-based, -1 if not a number word."""

    size: str
    colour: str
    shape: str
    row: int
    col: int

    @property
    def cell(self) -> tuple[int, int]:
        return (self.row, self.col)


@dataclass
class ParsedDescription:
    scene: str | None = None
    count: int | None = None
    objects: list[Mention] = field(default_factory=list)


def parse_description(text: str) -> ParsedDescription:
    """Scene type, stated count and every object mention, in order (repeats and unknown words kept)."""
    text = " ".join(text.lower().split())
    out = ParsedDescription()
    if m := _SCENE_RE.search(text):
        out.scene = m.group(1)
    if (m := _COUNT_RE.search(text)) and m.group(1) in _WORD_NUM:
        out.count = _WORD_NUM[m.group(1)]
    for m in _OBJ_RE.finditer(text):
        row, col, size, colour, shape = m.groups()
        r = ROW_LETTERS.find(row)
        out.objects.append(Mention(size, colour, shape, r, int(col) - 1 if r >= 0 else -1))
    return out
