"""Data sources: a user's datasets read as ``Sample``s, lazily (images are opened in ``__getitem__``, never all
decoded up front; a row index holds only text and paths).

- **LLaVA format** (``LlavaSource``): a JSON list or JSONL of ``{"id", "image": str | [str] (optional),
  "conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}`` with ``<image>`` placeholders
  anywhere in a human turn (LLaVA-Pretrain / LCS-558K, LLaVA-Instruct-665K, LLaVA-OneVision layouts). A row
  with images but no placeholder gets them before its first human turn's text (LLaVA's own convention);
  relative image paths resolve against ``image_folder`` (default: the file's directory).
- **Hugging Face datasets** (``HFSource``): a ``save_to_disk`` directory, or parquet / JSONL files, with TRL's
  conversational VLM layout (``messages`` with ``{"type": "image"}`` parts, and an ``images`` column of PIL
  images or paths, or one ``image``), or ``question`` / ``answer`` (+ ``image``) columns for short answers.

``open_dataset(path)`` picks the source from what ``path`` is. ``preflight(dataset)`` checks every row before
training (see there); the synthetic world is a source of its own (``keepsight.world``).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from PIL import Image

from ..fingerprint import digest
from ..jsonl import read_jsonl
from .sample import Sample

SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
IMAGE = "<image>"


def open_image(path: str | os.PathLike) -> Image.Image:
    """An RGB image from ``path``; a ValueError naming the file when it is missing or not an image."""
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except FileNotFoundError:
        raise ValueError(f"image {path} is missing") from None
    except (OSError, ValueError, Image.DecompressionBombError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"{path} is not a readable image ({type(e).__name__}: {e})") from None


def _file_fingerprint(path: Path, *extra) -> str:
    st = path.stat()
    return digest([str(path.resolve()), st.st_size, st.st_mtime_ns, *map(str, extra)])


# ----------------------------------------------------------------------------- LLaVA JSON / JSONL


def _read_rows(path: Path) -> list[dict]:
    """Every row of a LLaVA JSON list or JSONL file; malformed JSON is an error naming ``path:line``."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is read as editors write it
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); JSON data files are UTF-8") from None
    if not text.strip():
        raise ValueError(f"{path}: the file is empty (no rows)")
    head = text.lstrip()[:1]
    if head == "[":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    else:
        rows = [row for _, row in read_jsonl(path, "data")]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is a {type(row).__name__}, not a JSON object")
    return rows


def _split_images(text: str) -> list[dict]:
    """A human turn's text -> content parts, an image part at every ``<image>`` placeholder."""
    parts: list[dict] = []
    for j, piece in enumerate(text.split(IMAGE)):
        if j:
            parts.append({"type": "image"})
        piece = piece.strip()
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def llava_messages(row: dict, where: str = "row") -> tuple[list[dict], list[str]]:
    """(messages, image paths as written) of one LLaVA-format row; a ValueError naming ``where`` for a row that is
    not a conversation keepsight can train on."""
    convs = row.get("conversations")
    if not isinstance(convs, list) or not convs:
        raise ValueError(f"{where}: empty or missing 'conversations'")
    key = "image" if "image" in row else "images" if "images" in row else None
    images = row.get(key) if key else None
    if key is not None and images in (None, "", []):  # a text-only row has no image key at all (LLaVA's layout)
        raise ValueError(f"{where}: '{key}' is {images!r}; give the image path, or drop the key for a text-only row")
    images = [] if images is None else [images] if isinstance(images, str) else list(images)
    if not all(isinstance(p, str) and p for p in images):
        raise ValueError(f"{where}: 'image' must be a path or a list of paths, got {row.get('image')!r}")
    messages, placeholders = [], 0
    for k, turn in enumerate(convs):
        if not isinstance(turn, dict) or turn.get("from") not in SPEAKERS:
            speaker = turn.get("from") if isinstance(turn, dict) else turn
            raise ValueError(f"{where}: turn {k} is from an unknown speaker {speaker!r}; expected one of "
                             f"{sorted(set(SPEAKERS))}")
        value = turn.get("value")
        if not isinstance(value, str):
            raise ValueError(f"{where}: turn {k} has no text value")
        role = SPEAKERS[turn["from"]]
        placeholders += value.count(IMAGE)
        if role == "user":
            messages.append({"role": role, "content": _split_images(value)})
        else:
            if IMAGE in value:
                raise ValueError(f"{where}: turn {k} ({turn['from']}) holds an <image> placeholder; only human turns "
                                 "carry images")
            messages.append({"role": role, "content": [{"type": "text", "text": value.strip()}]})
    if placeholders == 0 and images:  # LLaVA's convention: the image(s) come with the first human turn
        first = next((m for m in messages if m["role"] == "user"), None)
        if first is None:
            raise ValueError(f"{where}: {len(images)} images but no human turn to carry them")
        first["content"] = [{"type": "image"} for _ in images] + first["content"]
    elif placeholders != len(images):
        raise ValueError(f"{where}: {placeholders} <image> placeholders but {len(images)} images")
    return messages, images


@dataclass
class LlavaSource:
    """A LLaVA-format JSON / JSONL file as ``Sample``s (see the module docstring)."""

    path: Path
    image_folder: Path | None = None
    rows: list[dict] = field(default_factory=list, repr=False)
    keep: list[int] | None = field(default=None, repr=False)  # the row indices kept after preflight

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.is_file():
            raise FileNotFoundError(f"data file {self.path} does not exist")
        self.image_folder = Path(self.image_folder) if self.image_folder is not None else self.path.parent
        if not self.rows:
            self.rows = _read_rows(self.path)
        if not self.rows:
            raise ValueError(f"{self.path} holds no rows")

    def _index(self, i: int) -> int:
        return self.keep[i] if self.keep is not None else i

    def __len__(self) -> int:
        return len(self.keep) if self.keep is not None else len(self.rows)

    def where(self, i: int) -> str:
        j = self._index(i)
        rid = self.rows[j].get("id")
        return f"{self.path} row {j}" + (f" (id {rid})" if rid is not None else "")

    def category(self, i: int) -> str | None:
        """The row's ``category`` field (benchmarks such as POPE or MME carry one), for scores by category."""
        value = self.rows[self._index(i)].get("category")
        if isinstance(value, (list, dict)):
            raise ValueError(f"{self.where(i)}: 'category' must be one name (a string or a number), got {value!r}")
        return None if value is None else str(value)

    def image_paths(self, i: int) -> list[Path]:
        _, images = llava_messages(self.rows[self._index(i)], self.where(i))
        return [Path(p) if Path(p).is_absolute() else self.image_folder / p for p in images]

    def __getitem__(self, i: int) -> Sample:
        row = self.rows[self._index(i)]
        messages, _ = llava_messages(row, self.where(i))
        images = [open_image(p) for p in self.image_paths(i)]
        return Sample(messages, images, None if row.get("id") is None else str(row.get("id")))

    @property
    def lengths(self) -> list[int]:
        """Words per row (for length-grouped batches; images count the same for every row)."""
        out = []
        for i in range(len(self)):
            convs = self.rows[self._index(i)].get("conversations") or []
            out.append(sum(len(str(t.get("value", "")).split()) for t in convs if isinstance(t, dict)))
        return out

    def fingerprint(self) -> str:
        return _file_fingerprint(self.path, self.image_folder, self.keep)


# ----------------------------------------------------------------------------- Hugging Face datasets


def _load_hf(path: Path):

    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise ValueError(f"{path} is a DatasetDict without a 'train' split ({list(ds)})")
            ds = ds["train"]
        return ds
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"{path} holds no save_to_disk dataset and no *.parquet files")
    if path.is_file() and path.suffix not in (".parquet", ".json", ".jsonl"):
        raise ValueError(f"data file {path} is not a dataset: give a LLaVA .json / .jsonl file, a .parquet file, or a "
                         "save_to_disk directory")
    kind = "parquet" if files[0].suffix == ".parquet" else "json"
    try:
        return datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train")
    except (datasets.exceptions.DatasetGenerationError, ValueError) as e:  # pyarrow: ArrowInvalid is a ValueError
        cause = e.__cause__ or e.__context__ or e
        raise ValueError(f"data {path} is not readable as {kind} ({type(cause).__name__}: "
                         f"{str(cause).splitlines()[0] if str(cause) else ''})") from None


def _undecoded(feature):
    """The same feature with ``datasets.Image`` columns left undecoded (``{"path", "bytes"}`` dicts)."""

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(feature, datasets.Sequence) and isinstance(feature.feature, datasets.Image):
        return datasets.Sequence(datasets.Image(decode=False))
    if isinstance(feature, list) and feature and isinstance(feature[0], datasets.Image):
        return [datasets.Image(decode=False)]
    return feature


def _parts(content) -> list[dict]:
    if isinstance(content, str):
        return _split_images(content) if IMAGE in content else [{"type": "text", "text": content}]
    out = []
    for p in content:
        if not isinstance(p, dict) or p.get("type") not in ("image", "text"):
            raise ValueError(f"content part {p!r} is neither an image nor a text part")
        out.append({"type": "image"} if p["type"] == "image" else {"type": "text", "text": p.get("text") or ""})
    return out


@dataclass
class HFSource:
    """A Hugging Face dataset as ``Sample``s (see the module docstring); image paths resolve against
    ``image_folder`` (default: the dataset's directory)."""

    path: Path
    image_folder: Path | None = None
    keep: list[int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.exists():
            raise FileNotFoundError(f"dataset {self.path} does not exist")
        self.data = _load_hf(self.path)
        cols = set(self.data.column_names)
        if "messages" in cols:
            self.layout = "messages"
        elif {"question", "answer"} <= cols:
            self.layout = "qa"
        else:
            raise ValueError(f"{self.path}: columns {sorted(cols)}: expected LLaVA rows ('conversations' + 'image'), "
                             "'messages' (+ 'images'), or 'question' and 'answer' (+ 'image')")
        self.image_column = next((c for c in ("images", "image") if c in cols), None)
        if self.image_column is not None:  # keep images undecoded: each is opened when its row is read
            self.data = self.data.cast_column(self.image_column, _undecoded(self.data.features[self.image_column]))
        base = self.path if self.path.is_dir() else self.path.parent
        self.image_folder = Path(self.image_folder) if self.image_folder is not None else base
        if len(self.data) == 0:
            raise ValueError(f"{self.path} holds no rows")

    def _index(self, i: int) -> int:
        return self.keep[i] if self.keep is not None else i

    def __len__(self) -> int:
        return len(self.keep) if self.keep is not None else len(self.data)

    def where(self, i: int) -> str:
        return f"{self.path} row {self._index(i)}"

    def _images(self, row) -> list:
        raw = row.get(self.image_column) if self.image_column else None
        raw = [] if raw is None else raw if isinstance(raw, list) else [raw]
        out = []
        for im in raw:
            if isinstance(im, Image.Image):
                out.append(im.convert("RGB"))
            elif isinstance(im, str):
                out.append(open_image(im if Path(im).is_absolute() else self.image_folder / im))
            elif isinstance(im, dict) and (im.get("path") or im.get("bytes")):  # an undecoded datasets Image
                out.append(open_image(io.BytesIO(im["bytes"])) if im.get("bytes") else open_image(im["path"]))
            else:
                raise ValueError(f"unreadable image entry {type(im).__name__}")
        return out

    def category(self, i: int) -> str | None:
        """The row's ``category`` column when the dataset has one."""
        if "category" not in self.data.column_names:
            return None
        value = self.data[self._index(i)]["category"]
        if isinstance(value, (list, dict)):
            raise ValueError(f"{self.where(i)}: 'category' must be one name (a string or a number), got {value!r}")
        return None if value is None else str(value)

    def messages(self, i: int) -> tuple[list[dict], int]:
        """(messages, number of images) of row ``i``, without opening its images."""
        row = self.data[self._index(i)]
        where = self.where(i)
        if self.layout == "qa":
            if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
                raise ValueError(f"{where}: 'question' and 'answer' must be strings")
            n = self._count_images(i)
            msgs = [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": row["question"]}]},
                    {"role": "assistant", "content": [{"type": "text", "text": row["answer"]}]}]
            return msgs, n
        msgs = row.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{where}: empty or missing 'messages'")
        out = []
        for k, m in enumerate(msgs):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ("system", "user", "assistant"):
                raise ValueError(f"{where}: message {k} has an unknown role {role!r}")
            try:
                out.append({"role": role, "content": _parts(m.get("content") or "")})
            except ValueError as e:
                raise ValueError(f"{where}: message {k}: {e}") from None
        n = sum(p["type"] == "image" for m in out for p in m["content"])
        return out, n

    def _count_images(self, i: int) -> int:
        if self.image_column is None:
            return 0
        raw = self.data[self._index(i)][self.image_column]
        return 0 if raw is None else len(raw) if isinstance(raw, list) else 1

    def __getitem__(self, i: int) -> Sample:
        messages, n = self.messages(i)
        row = self.data[self._index(i)]
        images = self._images(row)
        if len(images) != n:
            raise ValueError(f"{self.where(i)}: {n} image parts but {len(images)} images")
        rid = row.get("id")
        return Sample(messages, images, None if rid is None else str(rid))

    @property
    def lengths(self) -> list[int]:
        return [sum(len(p.get("text", "").split()) for m in self.messages(i)[0] for p in m["content"])
                for i in range(len(self))]

    def fingerprint(self) -> str:
        files = sorted(self.path.rglob("*")) if self.path.is_dir() else [self.path]
        return digest([[str(f), f.stat().st_size] for f in files if f.is_file()] + [str(self.image_folder), self.keep])


def open_dataset(path: str | os.PathLike, image_folder: str | os.PathLike | None = None):
    """The source ``path`` names: a LLaVA JSON / JSONL file, or a Hugging Face dataset (``save_to_disk``
    directory, parquet or JSONL files with ``messages`` or ``question`` / ``answer`` columns)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--data {path} does not exist")
    if path.is_file() and path.suffix in (".json", ".jsonl"):
        rows = _read_rows(path)
        if rows and "conversations" in rows[0]:
            return LlavaSource(path, image_folder, rows=rows)
        return HFSource(path, image_folder)
    return HFSource(path, image_folder)


# ----------------------------------------------------------------------------- pre-flight


@dataclass
class PreflightReport:
    """What a pre-flight pass found (printed before training, recorded in the summary)."""

    rows: int = 0
    turns: int = 0
    images: int = 0
    missing_images: int = 0
    unreadable_images: int = 0
    bad_rows: int = 0
    skipped: int = 0
    text_only: int = 0  # rows without an image (an image key that is null or empty in a question / answer layout)
    problems: list[str] = field(default_factory=list)  # the first few, "row 12 (id 7): image a.png is missing"

    def line(self) -> str:
        return (f"{self.rows} rows, {self.turns} turns, {self.images} images; {self.missing_images} missing and "
                f"{self.unreadable_images} unreadable images; {self.bad_rows} bad rows"
                + (f" ({self.skipped} skipped)" if self.skipped else "")
                + (f"; {self.text_only} rows have no image (trained / asked as text-only)" if self.text_only else ""))


def _check_image(path_or_bytes) -> str | None:
    """None when the image's header reads, else the problem ("missing" / "unreadable")."""
    try:
        with Image.open(path_or_bytes) as im:
            im.size  # noqa: B018  (the header is parsed; the pixels are not decoded)
        return None
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, Image.DecompressionBombError):  # a bomb: more pixels than PIL will decode
        return "unreadable"


def preflight(dataset, skip_bad_rows: bool = False, need_answers: bool = True, show: int = 5):
    """Check every row of a ``LlavaSource`` / ``HFSource`` before anything trains on it: the conversation parses,
    its ``<image>`` placeholders match its images, it has an assistant turn (``need_answers``), and every image
    file exists and its header reads. A bad row stops everything with an error naming the first ``show`` bad
    rows (index, id, path), unless ``skip_bad_rows``: then the dataset keeps only the good rows (and the report
    counts the skipped). Returns (dataset, report)."""
    report = PreflightReport()
    good = []
    base = dataset.keep
    dataset.keep = None
    try:
        n = len(dataset)
        for i in range(n):
            problem = None
            try:
                if isinstance(dataset, LlavaSource):
                    messages, _ = llava_messages(dataset.rows[i], dataset.where(i))
                    images = dataset.image_paths(i)
                else:
                    messages, n_images = dataset.messages(i)
                    raw = dataset.data[i][dataset.image_column] if dataset.image_column else None
                    raw = [] if raw is None else raw if isinstance(raw, list) else [raw]
                    if len(raw) != n_images:
                        raise ValueError(f"{dataset.where(i)}: {n_images} image parts but {len(raw)} images")
                    images = [io.BytesIO(r["bytes"]) if isinstance(r, dict) and r.get("bytes") else
                              (r.get("path") if isinstance(r, dict) else r) for r in raw]
                    images = [im if not isinstance(im, str) or Path(im).is_absolute() else dataset.image_folder / im
                              for im in images]
                report.turns += len(messages)
                report.text_only += not images
                if need_answers and not any(m["role"] == "assistant" for m in messages):
                    raise ValueError(f"{dataset.where(i)}: no assistant turn (nothing to train on)")
                for im in images:
                    report.images += 1
                    state = _check_image(im)
                    if state is not None:
                        report.missing_images += state == "missing"
                        report.unreadable_images += state == "unreadable"
                        raise ValueError(f"{dataset.where(i)}: image {im} is {state}")
            except ValueError as e:
                problem = str(e)
            report.rows += 1
            if problem is None:
                good.append(i)
            else:
                report.bad_rows += 1
                if len(report.problems) < show:
                    report.problems.append(problem)
    finally:
        dataset.keep = base
    if report.bad_rows and not skip_bad_rows:
        raise ValueError(f"{report.bad_rows} of {report.rows} rows are bad; the first: " + "; ".join(report.problems)
                         + " (pass --skip-bad-rows to train on the others)")
    if not good:
        raise ValueError("the dataset has no rows" if not report.rows else
                         f"no usable row: all {report.rows} rows are bad; the first: " + "; ".join(report.problems))
    if report.bad_rows:
        report.skipped = report.bad_rows
        dataset.keep = good
    return dataset, report


def export_llava(dataset, out: str | os.PathLike, image_folder: str | os.PathLike) -> Path:
    """Write ``dataset``'s ``Sample``s as a LLaVA-format JSON list (images saved as PNGs in ``image_folder``,
    paths relative to the JSON file's directory, where ``open_dataset`` resolves them by default): the world,
    for instance, for another framework or for ``--data`` tests."""
    out, folder = Path(out), Path(image_folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(len(dataset)):
        s = dataset[i]
        names = []
        for j, im in enumerate(s.images):
            name = f"{i:06d}-{j}.png"
            im.save(folder / name)
            names.append(os.path.relpath(folder / name, out.parent))
        convs = []
        for m in s.messages:
            if m["role"] == "user":
                value = " ".join(IMAGE if p["type"] == "image" else p["text"] for p in m["content"])
            else:
                value = " ".join(p.get("text", "") for p in m["content"])
            convs.append({"from": {"user": "human", "assistant": "gpt", "system": "system"}[m["role"]], "value": value})
        row = {"id": s.id or str(i), "conversations": convs}
        if names:
            row["image"] = names[0] if len(names) == 1 else names
        rows.append(row)
    out.write_text(json.dumps(rows))
    return out
