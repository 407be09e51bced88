"""Texts generated from a scene graph, and a parser that reads descriptions back.

Every text is a deterministic function of the scene graph (and, for questions, of the scene's seed).
Words are lower case and punctuation is split off, so the world's word-level tokenizer covers them.
"""

from __future__ import annotations

import numpy as np

from .config import ALL_COLOURS, ALL_SCENES, ALL_SHAPES, ALL_SIZES, MAX_GRID, WorldConfig
from .grammar import NUMBER_WORDS, ROW_LETTERS, ParsedDescription, parse_description, place  # noqa: F401
from .scene import Scene, SceneObject

DESCRIBE_PROMPT = "describe the image in detail ."
CAPTION_PROMPT = "give a short caption ."
YES_NO_CATEGORIES = ("existence", "count", "colour", "shape", "position", "scene")
OPEN_KINDS = ("count", "colour", "shape", "scene")


def number_word(n: int) -> str:
    return NUMBER_WORDS[n]


def object_phrase(o: SceneObject) -> str:
    """The place comes first ("at b3 a small red circle"), so the attributes are read for a named cell."""
    return f"at {place(o.row, o.col)} a {o.size} {o.colour} {o.shape}"


def description(scene: Scene) -> str:
    """The long "blind painter" description: scene type, count, then every object in raster order."""
    n = len(scene.objects)
    count = "there is one object ." if n == 1 else f"there are {number_word(n)} objects ."
    parts = [f"this is a {scene.scene} scene .", count]
    parts += [object_phrase(o) + " ." for o in scene.objects]
    return " ".join(parts)


# The varied descriptions (the diffusion regime): one scene, many right answers. Templates use only the words of
# ``scene_vocabulary`` (the tokenizer is shared by every world).
VARIED_HEADERS = ("this is a {scene} scene .", "a {scene} scene .", "the image is a {scene} scene .",
                  "in the image is a {scene} scene .")
VARIED_COUNTS = ("there are {n} objects .", "there are {n} objects in the image .", "{n} objects .", "")
VARIED_OBJECTS = ("at {cell} a {attrs} .", "a {attrs} at {cell} .", "at {cell} there is a {attrs} .",
                  "{cell} : a {attrs} .")


def varied_description(scene: Scene, rng: np.random.Generator, shuffle: bool = True) -> str:
    """A description with real variety (``rng`` picks): one of four headers, the count in one of three forms or
    left out, the objects in a random order (``shuffle``; else in raster order, as ``description`` lists them), each
    in one of four phrasings with its size stated half the time. ``parse_description(text, varied=True)`` reads every
    form back."""
    n = len(scene.objects)
    parts = [_pick(rng, VARIED_HEADERS).format(scene=scene.scene)]
    count = _pick(rng, VARIED_COUNTS)
    if count:
        parts.append("there is one object ." if n == 1 else count.format(n=number_word(n)))
    for k in (rng.permutation(n) if shuffle else range(n)):
        o = scene.objects[int(k)]
        attrs = f"{o.size} {o.colour} {o.shape}" if rng.random() < 0.5 else f"{o.colour} {o.shape}"
        parts.append(_pick(rng, VARIED_OBJECTS).format(cell=place(o.row, o.col), attrs=attrs))
    return " ".join(parts)


def caption(scene: Scene) -> str:
    n = len(scene.objects)
    noun = "object" if n == 1 else "objects"
    return f"a {scene.scene} scene with {number_word(n)} {noun} ."


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def yes_no_questions(scene: Scene, config: WorldConfig) -> list[dict]:
    """Two questions per category (one "yes", one "no"), so MME-style acc+ can be scored per image."""
    rng = np.random.default_rng([scene.seed, scene.index, 2])
    objs = scene.objects
    n = len(objs)
    present = {(o.colour, o.shape) for o in objs}
    out: list[dict] = []

    def add(category: str, yes: str, no: str) -> None:
        out.append({"category": category, "question": yes, "answer": "yes"})
        out.append({"category": category, "question": no, "answer": "no"})

    o = _pick(rng, objs)
    absent = [(c, s) for c in config.colours for s in config.shapes if (c, s) not in present]
    c, s = _pick(rng, absent)
    add("existence", f"is there a {o.colour} {o.shape} ?", f"is there a {c} {s} ?")

    wrong_n = _pick(rng, [m for m in range(1, config.max_objects + 1) if m != n])
    add("count", f"are there {number_word(n)} objects ?", f"are there {number_word(wrong_n)} objects ?")

    o, p = _pick(rng, objs), _pick(rng, objs)
    wrong = _pick(rng, [c for c in config.colours if c != p.colour])
    add(
        "colour",
        f"is the object at {place(o.row, o.col)} {o.colour} ?",
        f"is the object at {place(p.row, p.col)} {wrong} ?",
    )

    o, p = _pick(rng, objs), _pick(rng, objs)
    wrong = _pick(rng, [s for s in config.shapes if s != p.shape])
    add(
        "shape",
        f"is the object at {place(o.row, o.col)} a {o.shape} ?",
        f"is the object at {place(p.row, p.col)} a {wrong} ?",
    )

    o = _pick(rng, objs)
    rows, cols = config.grid
    r, k = divmod(int(rng.integers(rows * cols)), cols)
    there = scene.object_at(r, k)
    s = _pick(rng, [s for s in config.shapes if there is None or s != there.shape])
    add("position", f"is there a {o.shape} at {place(o.row, o.col)} ?", f"is there a {s} at {place(r, k)} ?")

    wrong = _pick(rng, [t for t in config.scenes if t != scene.scene])
    add("scene", f"is this a {scene.scene} scene ?", f"is this a {wrong} scene ?")
    return out


def count_questions(scene: Scene, config: WorldConfig) -> list[dict]:
    """Training items for comparing a count with the number in the question (the yes/no count category's
    failure: the model answered both of an image's count questions alike while its open count was right):
    "are there n objects ?" twice ("yes") against two "no"s, one a near miss (n - 1 or n + 1) and one any other
    number, so the answer turns on the number word alone. Not an evaluation set (``yes_no_questions`` is)."""
    rng = np.random.default_rng([scene.seed, scene.index, 5])
    n, top = len(scene.objects), config.max_objects
    near = _pick(rng, [m for m in (n - 1, n + 1) if 1 <= m <= top])
    other = _pick(rng, [m for m in range(1, top + 1) if m not in (n, near)] or [near])
    yes = {"category": "count", "question": f"are there {number_word(n)} objects ?", "answer": "yes"}
    return [yes, {"category": "count", "question": f"are there {number_word(near)} objects ?", "answer": "no"},
            dict(yes), {"category": "count", "question": f"are there {number_word(other)} objects ?", "answer": "no"}]


def open_questions(scene: Scene) -> list[dict]:
    """Short open questions whose exact answers serve as verifiable rewards."""
    rng = np.random.default_rng([scene.seed, scene.index, 3])
    o, p = _pick(rng, scene.objects), _pick(rng, scene.objects)
    return [
        {"kind": "count", "question": "how many objects are there ?", "answer": number_word(len(scene.objects))},
        {"kind": "colour", "question": f"what colour is the object at {place(o.row, o.col)} ?", "answer": o.colour},
        {"kind": "shape", "question": f"what shape is the object at {place(p.row, p.col)} ?", "answer": p.shape},
        {"kind": "scene", "question": "what scene is this ?", "answer": scene.scene},
    ]


def cell_questions(scene: Scene, config: WorldConfig, n: int = 4) -> list[dict]:
    """Grounding questions "what is at b3 ?" -> "a large red star" (or "nothing" for an empty cell):
    half about occupied cells, half about any cell. Dense, short supervision for reading one cell."""
    rng = np.random.default_rng([scene.seed, scene.index, 4])
    rows, cols = config.grid
    occupied = [(o.row, o.col) for o in scene.objects]
    cells = [occupied[int(rng.integers(len(occupied)))] if i % 2 == 0
             else divmod(int(rng.integers(rows * cols)), cols) for i in range(n)]
    out = []
    for r, k in cells:
        o = scene.object_at(r, k)
        answer = "nothing" if o is None else f"a {o.size} {o.colour} {o.shape}"
        out.append({"kind": "cell", "question": f"what is at {place(r, k)} ?", "answer": answer})
    return out


def lookup_questions(scene: Scene, config: WorldConfig, empty: int = 2) -> list[dict]:
    """Cell lookup (the ground stage), for every object: "what colour / shape is the object at b3 ?" -> "red", and
    the same read with the cell restated first, "colour at b3 ?" -> "b3 red"; and "what is at c1 ?" -> "nothing"
    for ``empty`` empty cells (drawn from the scene's seed; fewer if fewer are empty).

    The restated form is what makes the direct one learnable in a small model: there the attribute is predicted at
    the cell name's own position, so one attention step (the name to its image token) answers it, and it is learnt
    in a few hundred steps. The direct answer needs two (the answer's position to the name, the name to the image):
    trained alone, a plateau of thousands of steps that a mixed instruction set never left (README: the grounded
    recipe)."""
    rng = np.random.default_rng([scene.seed, scene.index, 6])
    out = []
    for o in scene.objects:
        at = place(o.row, o.col)
        out += [{"kind": "colour", "question": f"what colour is the object at {at} ?", "answer": o.colour},
                {"kind": "shape", "question": f"what shape is the object at {at} ?", "answer": o.shape},
                {"kind": "colour_at", "question": f"colour at {at} ?", "answer": f"{at} {o.colour}"},
                {"kind": "shape_at", "question": f"shape at {at} ?", "answer": f"{at} {o.shape}"}]
    rows, cols = config.grid
    free = [(r, k) for r in range(rows) for k in range(cols) if scene.object_at(r, k) is None]
    for j in rng.permutation(len(free))[:empty]:
        r, k = free[int(j)]
        out.append({"kind": "empty", "question": f"what is at {place(r, k)} ?", "answer": "nothing"})
    return out


def rehearsal_questions(scene: Scene, config: WorldConfig, lookups: int = 4, colour_yes_no: int = 4) -> list[dict]:
    """What keeps the ground stage's reading through instruct (the grounded recipe's "rehearse" task): ``lookups``
    of the scene's ``lookup_questions``, and ``colour_yes_no`` colour questions "is the object at b3 red ?" about
    objects drawn from the scene's seed, "yes" and "no" in turn (a "no" names another colour, drawn uniformly).

    Without them instruct undoes the lookup (the direct colour answer falls from 1.00 after ``ground`` to the
    scene prior's 0.70), and the yes/no colour category stays at chance on some seeds while the open colour answer
    is right (README: the grounded recipe)."""
    qs = lookup_questions(scene, config)
    rng = np.random.default_rng([scene.seed, scene.index, 7])
    out = [qs[int(i)] for i in sorted(rng.choice(len(qs), size=min(lookups, len(qs)), replace=False))]
    for j in range(colour_yes_no if scene.objects else 0):
        o = scene.objects[int(rng.integers(len(scene.objects)))]
        colour, answer = o.colour, "yes"
        if j % 2:
            others = [c for c in config.colours if c != o.colour]
            colour, answer = others[int(rng.integers(len(others)))], "no"
        out.append({"kind": "colour_yes_no", "question": f"is the object at {place(o.row, o.col)} {colour} ?",
                    "answer": answer})
    return out


def scene_vocabulary() -> list[str]:
    """Every word any text of any world can use (independent of the difficulty, so tokenizers are shared)."""
    words = set(NUMBER_WORDS) | set(ALL_SCENES) | set(ALL_SHAPES) | set(ALL_COLOURS) | set(ALL_SIZES)
    words |= {place(r, c) for r in range(MAX_GRID) for c in range(MAX_GRID)}
    for text in (DESCRIBE_PROMPT, CAPTION_PROMPT, "this is a scene . there are is one object objects with",
                 "a at ? yes no how many what colour shape nothing", "is there a are is the object this scene",
                 "user assistant :"):
        words |= set(text.split())
    return sorted(words)
