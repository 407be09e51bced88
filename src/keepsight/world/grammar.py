"""The world's description grammar read back into mentions: cells, number words, the fixed and varied phrasings
(pure stdlib; ``keepsight.world.chair`` and the dilution curve score what it reads)."""

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
# the varied phrasings (keepsight.world.texts.varied_description): the size is optional, the cell before or after
_ATTRS = r"an? (?:(small|large) )?(\w+) (\w+)"
_VARIED_OBJ_RE = re.compile(rf"\bat ([a-z])(\d+) (?:there is )?{_ATTRS}|\b{_ATTRS} at ([a-z])(\d+)\b"
                            rf"|\b([a-z])(\d+) : {_ATTRS}")
_VARIED_SCENE_RE = re.compile(r"(?:^|\. )(?:this is |the image is |in the image is )?an? (\w+) scene\b")


def place(row: int, col: int) -> str:
    """0-based cell -> its name: (1, 2) -> "b3"."""
    return f"{ROW_LETTERS[row]}{col + 1}"


@dataclass
class Mention:
    """One object as a description names it. ``row``/``col`` are 0-based, -1 if not a number word."""

    size: str | None  # None: not stated (varied descriptions leave it out half the time)
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


def parse_description(text: str, varied: bool = False) -> ParsedDescription:
    """Scene type, stated count and every object mention, in order (repeats and unknown words kept).
    ``varied``: also the phrasings of ``varied_description`` (the size may be missing: ``None``)."""
    text = " ".join(text.lower().split())
    out = ParsedDescription()
    if m := (_VARIED_SCENE_RE if varied else _SCENE_RE).search(text):
        out.scene = m.group(1)
    if (m := _COUNT_RE.search(text)) and m.group(1) in _WORD_NUM:
        out.count = _WORD_NUM[m.group(1)]
    elif varied and (m := re.search(r"(?:^|\. )(\w+) objects \.", text)) and m.group(1) in _WORD_NUM:
        out.count = _WORD_NUM[m.group(1)]
    if varied:
        for m in _VARIED_OBJ_RE.finditer(text):
            g = m.groups()
            row, col, size, colour, shape = next(
                (c[0], c[1], c[2], c[3], c[4]) for c in ((g[0], g[1], g[2], g[3], g[4]), (g[8], g[9], g[5], g[6], g[7]),
                                                        (g[10], g[11], g[12], g[13], g[14])) if c[0] is not None)
            r = ROW_LETTERS.find(row)
            out.objects.append(Mention(size, colour, shape, r, int(col) - 1 if r >= 0 else -1))
        return out
    for m in _OBJ_RE.finditer(text):
        row, col, size, colour, shape = m.groups()
        r = ROW_LETTERS.find(row)
        out.objects.append(Mention(size, colour, shape, r, int(col) - 1 if r >= 0 else -1))
    return out
