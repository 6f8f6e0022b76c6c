"""A synthetic visual grounding task: one dark box on a light, noisy background, and "where is it?".

The write-up's recipes (docs/demo.md) were evaluated on bounding boxes (nutrition labels); this is the same task in miniature, small
enough to train the demo's tiny Qwen2-VL on a CPU. Everything is a function of (index, seed):

    >>> s = make_sample(0, seed=0)
    >>> s.question, parse_box(s.answer)[0] == s.box
    ('Locate the box.', True)

Images are 112x112 RGB: the demo's image processor cuts them into 8x8 patches of 14 px, merged 2x2 into 16 image
tokens of 28x28 px. The box lies on that coarse 4x4 grid of image tokens, so a tiny model learns the task in
seconds; it is dark, of a random hue, on a light background of random tint, with pixel noise. Answers are
Qwen2-VL's normalized 0..1000 coordinates written `[x1, y1, x2, y2]`; `parse_box` also reads Qwen2-VL's own
`(x1,y1),(x2,y2)` form.

On disk (`write_dataset` / `read_dataset`): `images/NNNNN.png` and `data.jsonl`, one JSON object per line with
`image` (a path relative to the folder), `question`, `answer` and `box`. A row that cannot be read (malformed
JSON, a missing field, a missing or unreadable image) is kept as a row with an `error`, never dropped.
"""

from __future__ import annotations

import colorsys
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

Box = tuple[int, int, int, int]

QUESTION = "Locate the box."
IMAGE_SIZE = 112
GRID = 4            # cells per side; one cell = 28 px = one merged image token of the demo's image processor
SCALE = 1000        # Qwen2-VL's normalized coordinate range
NOISE_STD = 10.0    # pixel noise (0..255 scale)

_NUMBER = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BRACKET_BOX = re.compile(r"\[" + ",".join([_NUMBER] * 4) + r"\]")
_QWEN_BOX = re.compile(r"\(" + _NUMBER + "," + _NUMBER + r"\)\s*,?\s*\(" + _NUMBER + "," + _NUMBER + r"\)")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One grounding example: the image, its box (0..1000, x1 y1 x2 y2), the question and the reference answer."""

    image: Image.Image
    box: Box
    question: str
    answer: str


@dataclasses.dataclass
class GroundingRow:
    """One line of a dataset on disk. `error` says why the row cannot be used; its other fields may then be None."""

    line: int
    image_path: str | None = None
    question: str | None = None
    answer: str | None = None
    box: Box | None = None
    image: Image.Image | None = None
    error: str | None = None


def format_box(box: Box) -> str:
    """The answer text for a box: `[x1, y1, x2, y2]`."""
    return "[" + ", ".join(str(v) for v in box) + "]"


def parse_box(text: str | None, scale: int = SCALE) -> tuple[Box | None, str | None]:
    """(box, None) from a model's answer, or (None, why not). Reads `[x1, y1, x2, y2]` and Qwen2-VL's
    `(x1,y1),(x2,y2)` (with or without `<|box_start|>`), whatever the spacing; the first box found wins.

    >>> parse_box("[ 0,250 , 500, 1000 ]")
    ((0, 250, 500, 1000), None)
    >>> parse_box("<|box_start|>(10,20),(30,40)<|box_end|>")
    ((10, 20, 30, 40), None)
    >>> parse_box("[1, 2, 3]")
    (None, 'malformed box: [1, 2, 3]')
    """
    if text is None or not text.strip():
        return None, "empty answer"
    found = [m for m in (_BRACKET_BOX.search(text), _QWEN_BOX.search(text)) if m]
    if not found:
        fragment = re.search(r"[\[(][^\])]*[\])]?", text)
        if fragment:
            return None, f"malformed box: {fragment.group(0)[:60]}"
        return None, f"no box in the answer: {text.strip()[:60]!r}"
    match = min(found, key=lambda m: m.start())
    numbers = match.groups()
    if any("." in n for n in numbers):
        return None, f"coordinates are not integers: {match.group(0)}"
    x1, y1, x2, y2 = (int(n) for n in numbers)
    if any(v < 0 or v > scale for v in (x1, y1, x2, y2)):
        return None, f"coordinates outside 0..{scale}: {match.group(0)}"
    if x2 < x1 or y2 < y1:
        return None, f"inverted box (x2 < x1 or y2 < y1): {match.group(0)}"
    return (x1, y1, x2, y2), None


def _rng(index: int, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, index])


def _box_colour(rng: np.random.Generator) -> np.ndarray:
    """A dark colour of random hue: the box differs from the light background by its lightness whatever its hue.
    (With bright colours of random hue the tiny model did not learn to find the box in a few hundred steps.)"""
    r, g, b = colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.5, 1.0), rng.uniform(0.1, 0.35))
    return np.array([r, g, b]) * 255


def random_box_cells(rng: np.random.Generator, grid: int = GRID) -> tuple[int, int, int, int]:
    """A box in grid cells (x1, y1, x2, y2), at least one cell wide and high; every span equally likely."""
    spans = [(a, b) for a in range(grid) for b in range(a + 1, grid + 1)]
    (x1, x2), (y1, y2) = (spans[i] for i in rng.integers(0, len(spans), size=2))
    return x1, y1, x2, y2


def make_sample(index: int, seed: int = 0) -> Sample:
    """Sample `index` of the task drawn with `seed`: same arguments, same pixels and answer."""
    rng = _rng(index, seed)
    cells = random_box_cells(rng)
    cell_px = IMAGE_SIZE // GRID
    pixels = np.empty((IMAGE_SIZE, IMAGE_SIZE, 3))
    pixels[:] = rng.uniform(170, 250) + rng.uniform(-15, 15, size=3)     # a light, slightly tinted background
    x1, y1, x2, y2 = (c * cell_px for c in cells)
    pixels[y1:y2, x1:x2] = _box_colour(rng)
    pixels += rng.normal(0, NOISE_STD, size=pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    box = tuple(round(c * SCALE / GRID) for c in cells)
    return Sample(image=image, box=box, question=QUESTION, answer=format_box(box))


def write_dataset(folder: str | Path, n: int, seed: int = 0) -> Path:
    """Write samples 0..n-1 of `seed` as `images/NNNNN.png` + `data.jsonl`; returns the folder."""
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(n):
        sample = make_sample(index, seed)
        relative = f"images/{index:05d}.png"
        sample.image.save(folder / relative)
        lines.append(json.dumps({"image": relative, "question": sample.question, "answer": sample.answer,
                                 "box": list(sample.box), "seed": seed, "index": index}))
    (folder / "data.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _row_from_record(record: Any, line: int, folder: Path) -> GroundingRow:
    if not isinstance(record, dict):
        return GroundingRow(line, error=f"line {line}: not a JSON object")
    missing = [k for k in ("image", "question", "answer", "box") if k not in record]
    if missing:
        return GroundingRow(line, error=f"line {line}: missing field(s) {', '.join(missing)}")
    row = GroundingRow(line, image_path=str(record["image"]), question=str(record["question"]),
                       answer=str(record["answer"]))
    box = record["box"]
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, int) for v in box)):
        row.error = f"line {line}: box is not four integers: {box!r}"
        return row
    row.box = tuple(box)
    path = folder / row.image_path
    if not path.is_file():
        row.error = f"line {line}: image not found: {row.image_path}"
        return row
    try:
        with Image.open(path) as opened:
            row.image = opened.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - any unreadable image is that row's error
        row.error = f"line {line}: image unreadable ({type(exc).__name__}: {exc})"
    return row


def read_dataset(folder: str | Path) -> list[GroundingRow]:
    """Every non-blank line of `folder/data.jsonl` as a row, images loaded; unreadable rows carry an `error`."""
    folder = Path(folder)
    rows = []
    for line, text in enumerate((folder / "data.jsonl").read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            rows.append(GroundingRow(line, error=f"line {line}: malformed JSON ({exc.msg})"))
            continue
        rows.append(_row_from_record(record, line, folder))
    return rows
