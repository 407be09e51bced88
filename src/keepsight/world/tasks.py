"""The world as a data source: scenes with their images, and the task datasets built from them (text-only
descriptions for the language-model stage, per-cell targets for the vision stage, and ``Sample``s of
descriptions, captions, yes/no, open and grounding questions for every VLM recipe)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..data import IGNORE_INDEX, Sample
from ..fingerprint import digest
from .balanced import balanced_yes_no
from .config import WorldConfig
from .dialog import conversation, describe_then_ask
from .render import render
from .scene import Scene
from .texts import (
    CAPTION_PROMPT,
    DESCRIBE_PROMPT,
    caption,
    cell_questions,
    count_questions,
    description,
    lookup_questions,
    open_questions,
    rehearsal_questions,
    varied_description,
    yes_no_questions,
)


@dataclass
class WorldSamples:
    """Scenes with their rendered images, kept in memory (64x64 RGB images are ~12 KB each)."""

    config: WorldConfig
    scenes: list[Scene]
    images: list[Image.Image]

    @classmethod
    def from_scenes(cls, config: WorldConfig, scenes: list[Scene]) -> WorldSamples:
        return cls(config, scenes, [render(s, config.noise_std) for s in scenes])

    @classmethod
    def from_records(cls, config: WorldConfig, records: list[dict]) -> WorldSamples:
        """From ``read_world`` records (images loaded from their PNG files; each must be an image of the world's
        size, since its scene graph is the ground truth for exactly that picture)."""
        scenes = [Scene.from_dict(r["scene"]) for r in records]
        images = []
        side = config.image_size
        for r in records:
            try:
                with Image.open(r["image"]) as im:
                    images.append(im.convert("RGB"))
            except (OSError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
                raise ValueError(f"{r['image']} is not a readable image ({type(e).__name__}: {e})") from None
            if images[-1].size != (side, side):
                raise ValueError(f"{r['image']} is {images[-1].size[0]}x{images[-1].size[1]} pixels but the world "
                                 f"(world.json) draws {side}x{side}: its scene graph would not describe it")
        return cls(config, scenes, images)

    def __len__(self) -> int:
        return len(self.scenes)

    def fingerprint(self) -> str:
        """The world and the scenes (a scene is a function of its id: seed and index)."""
        return digest([self.config.to_dict(), [s.id for s in self.scenes]])


# ----------------------------------------------------------------------------- text-only LM


class TextDataset(torch.utils.data.Dataset):
    """Text-only pretraining corpus: descriptions and captions of scenes (the world's language prior)."""

    def __init__(self, samples: WorldSamples):
        self.texts = []
        for s in samples.scenes:
            self.texts += [description(s), caption(s)]

    def __len__(self) -> int:
        return len(self.texts)

    def fingerprint(self) -> str:
        return digest(self.texts)

    def __getitem__(self, i: int) -> dict:
        return {"text": self.texts[i]}


# ----------------------------------------------------------------------------- vision tower


class VisionDataset(torch.utils.data.Dataset):
    """Images with per-cell targets: shape (0 = empty cell), colour, size, and the scene type (with ``count``, also
    the number of objects)."""

    def __init__(self, samples: WorldSamples, count: bool = False):
        c = samples.config
        self.samples, self.count = samples, count
        self.rows, self.cols = c.grid
        self.shape_ix = {s: i + 1 for i, s in enumerate(c.shapes)}
        self.colour_ix = {s: i for i, s in enumerate(c.colours)}
        self.size_ix = {s: i for i, s in enumerate(c.sizes)}
        self.scene_ix = {s: i for i, s in enumerate(c.scenes)}

    def __len__(self) -> int:
        return len(self.samples)

    def fingerprint(self) -> str:
        return self.samples.fingerprint()

    def __getitem__(self, i: int) -> dict:
        s = self.samples.scenes[i]
        cells = self.rows * self.cols
        shape = np.zeros(cells, dtype=np.int64)
        colour = np.full(cells, IGNORE_INDEX, dtype=np.int64)
        size = np.full(cells, IGNORE_INDEX, dtype=np.int64)
        for o in s.objects:
            k = o.row * self.cols + o.col
            shape[k], colour[k], size[k] = self.shape_ix[o.shape], self.colour_ix[o.colour], self.size_ix[o.size]
        out = {"image": self.samples.images[i], "shape": shape, "colour": colour, "size": size,
               "scene": self.scene_ix[s.scene]}
        if self.count:
            out["count"] = len(s.objects)
        return out


@dataclass
class VisionCollator:
    image_processor: object
    count: bool = False

    def __call__(self, batch: list[dict]) -> dict:
        pix = self.image_processor([b["image"] for b in batch], return_tensors="pt")["pixel_values"]
        out = {"pixel_values": pix}
        for k in ("shape", "colour", "size"):
            out[k] = torch.as_tensor(np.stack([b[k] for b in batch]))
        out["scene"] = torch.tensor([b["scene"] for b in batch])
        if self.count:
            out["count"] = torch.tensor([b["count"] for b in batch])
        return out


# ----------------------------------------------------------------------------- VLM (alignment, instruction)


class VLMDataset(torch.utils.data.Dataset):
    """``Sample``s about the scenes' images. ``mix`` picks which tasks each scene contributes: "describe",
    "caption", "yes_no" (the yes and the no question of ``yes_no_categories`` categories drawn per scene),
    "yes_no_balanced" (the same questions, each with its twin: the same words asked of another scene where the
    answer is the other one, ``balanced.balanced_yes_no``; the question's text then says nothing about the answer,
    so only reading the image lowers the loss: the PVM mechanism control's training data),
    "open" (one), "cells" (four "what is at b3 ?" grounding questions), "chat" (one conversation of 2 ..
    ``max_turns`` short questions about the image, every answer a target; ``keepsight.world.dialog``),
    "chat_image" (a "chat" whose image is shown again just before one later question, drawn uniformly: the format
    of the history regime's oracle, so that a second look at the image is something the model was trained on),
    "lookup" (``texts.lookup_questions``: the colour and shape of every object by its cell, asked directly and with
    the cell restated in the answer, and "what is at ..." for two empty cells: answers that can only come from
    reading the named cell),
    "rehearse" (``texts.rehearsal_questions``: ``rehearsal[0]`` of the scene's lookups and ``rehearsal[1]`` colour
    yes/no questions, which keep the ground stage's reading through instruct),
    "describe_varied" (a description with varied phrasing and object order: ``texts.varied_description``),
    "describe_phrased" (the same phrasings with the objects in raster order: what each object is and where stays
    fixed by the image, only the words around it and their count vary),
    "count_yes_no" (four "are there n objects ?" items, two "yes" and two "no" with one a near-miss number:
    ``texts.count_questions``),
    "describe_ask" (a description turn, then one yes/no question, the image shown again before the question half
    the time: ``dialog.describe_then_ask``; the generated-text regime's format and its oracle's).
    ``describe_repeats`` repeats each description: with length-grouped batches every batch holds one
    kind of item, so this sets the share of optimizer steps spent on long descriptions. ``varied_repeats``: how many
    varied (or phrased) descriptions each scene gets (each drawn anew; None: ``describe_repeats``)."""

    TASKS = ("describe", "caption", "yes_no", "open", "cells", "chat", "describe_varied", "count_yes_no",
             "chat_image", "lookup", "describe_ask", "rehearse", "yes_no_balanced", "describe_phrased")

    def __init__(self, samples: WorldSamples, mix: tuple[str, ...] = TASKS[:5], seed: int = 0,
                 yes_no_categories: int = 2, describe_repeats: int = 1, max_turns: int = 16,
                 rehearsal: tuple[int, int] = (4, 4), varied_repeats: int | None = None):
        unknown = set(mix) - set(self.TASKS)
        if unknown:
            raise ValueError(f"unknown tasks {sorted(unknown)}; choose from {self.TASKS}")
        if max_turns < 2:
            raise ValueError(f"max_turns must be >= 2, got {max_turns}")
        varied_repeats = describe_repeats if varied_repeats is None else varied_repeats
        if varied_repeats < 1 or describe_repeats < 1:
            raise ValueError(f"describe_repeats and varied_repeats must be >= 1, got {describe_repeats} and "
                             f"{varied_repeats}")
        rng = np.random.default_rng(seed)
        self.samples = samples
        self.items: list[tuple[int, str, str]] = []  # (scene index, prompt, answer)
        self.chats: dict[int, list[dict]] = {}  # item index -> its conversation's turns ("chat" items)
        self.reinsert: dict[int, int] = {}  # item index -> the turn before which the image is shown again
        self.categories: list[str] = []  # per item: its task, or the yes/no question's category
        # "yes_no_balanced": scene index -> category -> its questions' (question, twin) pairs, in the generator's order
        twins: dict[int, dict[str, list[tuple[dict, dict]]]] = {}
        if "yes_no_balanced" in mix:
            items = balanced_yes_no(samples.scenes, samples.config)
            for a, b in zip(items[::2], items[1::2]):
                twins.setdefault(a["scene"], {}).setdefault(a["category"], []).append((a, b))
        for i, s in enumerate(samples.scenes):
            if "describe" in mix:
                self.items += [(i, DESCRIBE_PROMPT, description(s))] * describe_repeats
                self.categories += ["describe"] * describe_repeats
            if "caption" in mix:
                self.items.append((i, CAPTION_PROMPT, caption(s)))
                self.categories.append("caption")
            if "yes_no" in mix:
                qs = yes_no_questions(s, samples.config)
                for cat in rng.choice(len(qs) // 2, size=yes_no_categories, replace=False):
                    for q in qs[2 * cat : 2 * cat + 2]:
                        self.items.append((i, q["question"], q["answer"]))
                        self.categories.append(q["category"])
            if "yes_no_balanced" in mix:
                by_category = twins.get(i, {})
                cats = list(by_category)
                for c in rng.choice(len(cats), size=min(yes_no_categories, len(cats)), replace=False):
                    for pair in by_category[cats[c]]:
                        self.items += [(q["scene"], q["question"], q["answer"]) for q in pair]
                        self.categories += [cats[c]] * 2
            if "open" in mix:
                qs = open_questions(s)
                q = qs[int(rng.integers(len(qs)))]
                self.items.append((i, q["question"], q["answer"]))
                self.categories.append("open")
            if "cells" in mix:
                cells = cell_questions(s, samples.config)
                self.items += [(i, q["question"], q["answer"]) for q in cells]
                self.categories += ["cells"] * len(cells)
            if "chat" in mix:
                self._add_chat(i, conversation(s, samples.config, rng, int(rng.integers(2, max_turns + 1))), "chat")
            if "chat_image" in mix:
                turns = conversation(s, samples.config, rng, int(rng.integers(2, max_turns + 1)))
                self._add_chat(i, turns, "chat_image", int(rng.integers(1, len(turns))))
            if "describe_ask" in mix:
                turns = describe_then_ask(s, samples.config, rng)
                self._add_chat(i, turns, "describe_ask", 1 if rng.random() < 0.5 else None)
            if "count_yes_no" in mix:
                qs = count_questions(s, samples.config)
                self.items += [(i, q["question"], q["answer"]) for q in qs]
                self.categories += ["count"] * len(qs)
            if "lookup" in mix:
                qs = lookup_questions(s, samples.config)
                self.items += [(i, q["question"], q["answer"]) for q in qs]
                self.categories += ["lookup"] * len(qs)
            if "rehearse" in mix:
                qs = rehearsal_questions(s, samples.config, *rehearsal)
                self.items += [(i, q["question"], q["answer"]) for q in qs]
                self.categories += ["colour" if q["kind"] == "colour_yes_no" else "lookup" for q in qs]
            if "describe_varied" in mix:
                self.items += [(i, DESCRIBE_PROMPT, varied_description(s, rng)) for _ in range(varied_repeats)]
                self.categories += ["describe_varied"] * varied_repeats
            if "describe_phrased" in mix:
                self.items += [(i, DESCRIBE_PROMPT, varied_description(s, rng, shuffle=False))
                               for _ in range(varied_repeats)]
                self.categories += ["describe_phrased"] * varied_repeats
        # approximate text lengths (words) for length-grouped batching; image tokens are the same for all
        self.lengths = [len(p.split()) + len(a.split()) for _, p, a in self.items]

    def _add_chat(self, scene: int, turns: list[dict], category: str, reinsert_at: int | None = None) -> None:
        """One conversation item of scene index ``scene`` (its image shown again before turn ``reinsert_at``)."""
        if reinsert_at is not None:
            self.reinsert[len(self.items)] = reinsert_at
        self.chats[len(self.items)] = turns
        self.items.append((scene, " ".join(t["question"] for t in turns), " ".join(t["answer"] for t in turns)))
        self.categories.append(category)

    def __len__(self) -> int:
        return len(self.items)

    def fingerprint(self) -> str:
        return digest([self.samples.fingerprint(), self.items])

    def category(self, i: int) -> str:
        """Item ``i``'s task ("describe", "open", ...), or for a yes/no question its category ("colour", ...)."""
        return self.categories[i]

    def __getitem__(self, i: int) -> Sample:
        k, prompt, answer = self.items[i]
        image, scene_id = self.samples.images[k], self.samples.scenes[k].id
        if i in self.chats:
            return chat_sample(self.chats[i], image, scene_id, reinsert_at=self.reinsert.get(i))
        return Sample.single_turn(prompt, answer, image, id=scene_id)


def chat_sample(turns: list[dict], image, scene_id: str | None = None, answer_last: bool = True,
                reinsert_image: bool = False, reinsert_at: int | None = None) -> Sample:
    """A conversation about one image: the image with the first question, then the turns in order. With
    ``answer_last=False`` the last question is left for the model (a generation prompt); ``reinsert_image``: the
    image again, just before the last question (the history regime's oracle: the image as close as it can be);
    a turn with ``"context": True`` is read but not trained on (``data.collator.assistant_spans``);
    ``reinsert_at``: the image again just before question ``reinsert_at`` (1 .. len(turns) - 1) instead."""
    if reinsert_image and reinsert_at is not None:
        raise ValueError("give reinsert_image or reinsert_at, not both")
    at = (len(turns) - 1 or None) if reinsert_image else reinsert_at  # one turn: the image is already just before it
    if at is not None and not 1 <= at < len(turns):
        raise ValueError(f"reinsert_at must be in [1, {len(turns) - 1}] for {len(turns)} turns, got {at}")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": turns[0]["question"]}]}]
    for j, t in enumerate(turns):
        if j:
            parts = [{"type": "text", "text": t["question"]}]
            if j == at:
                parts.insert(0, {"type": "image"})
            messages.append({"role": "user", "content": parts})
        if answer_last or j < len(turns) - 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": t["answer"]}]})
            if t.get("context"):
                messages[-1]["context"] = True
    images = [image, image] if at is not None else [image]
    return Sample(messages, images, scene_id)


INSTRUCT_TASKS = ("describe", "caption", "yes_no", "open", "cells")


def instruct_data(samples: WorldSamples, seed: int = 0, tasks: tuple[str, ...] = INSTRUCT_TASKS,
                  max_turns: int = 16, yes_no_categories: int = 2,
                  rehearsal: tuple[int, int] = (4, 4)) -> VLMDataset:
    """The instruction mix the method recipes train on (PVM stage 1, the LoRA control, bridge phase 2): the
    base's instruct tasks, each description three times (with length-grouped batches about a quarter of the
    steps)."""
    return VLMDataset(samples, tasks, seed, yes_no_categories=yes_no_categories, describe_repeats=3,
                      max_turns=max_turns, rehearsal=rehearsal)


def caption_data(samples: WorldSamples, seed: int = 0) -> VLMDataset:
    """Descriptions and captions (the alignment stage's and a bridge's phase 1)."""
    return VLMDataset(samples, ("describe", "caption"), seed)
