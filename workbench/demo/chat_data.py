"""The demo's chat dataset: short user/assistant conversations for the demo tokenizer, built offline, healthy.

    path = demo_chat_data()            # .cache/demo/chat-data.jsonl (200 rows, written once)
    write_chat_data(path, rows=20000)  # any size, deterministic (the benchmark's)

Every row is `{"messages": [system?, user, assistant]}` with answers well inside trl's default max_length, so
the data-path notebook passes on it: answers supervised, the end-of-turn token supervised, nothing truncated, no
special token in the text. Tests plant the defects on top of it.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, Iterator

QUESTIONS = ["What is in this image?", "Describe the nutrition label.", "Where is the box?",
             "Which object is red?", "How many calories are listed?", "Locate the question text."]
ANSWERS = ["A red box on a white background.", "Calories, fat, protein and carbohydrates.",
           "The bounding box of the object is [{a}, {b}, {c}, {d}].", "The box in the top left corner.",
           "It lists {a} calories.", "The answer is at [{a}, {b}, {c}, {d}]."]


def chat_rows(rows: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in range(rows):
        k = rng.randrange(len(QUESTIONS))
        numbers = dict(a=rng.randrange(100), b=rng.randrange(100), c=100 + rng.randrange(900),
                       d=100 + rng.randrange(900))
        messages = [{"role": "user", "content": QUESTIONS[k]},
                    {"role": "assistant", "content": ANSWERS[k].format(**numbers)}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Answer with the box."})
        yield {"messages": messages}


def write_chat_data(path: str | Path, rows: int = 200, seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in chat_rows(rows, seed):
            handle.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
    return path


def demo_chat_data(root: str | Path | None = None) -> Path:
    """The demo's healthy chat dataset beside its checkpoints (written on first use)."""
    from workbench.demo.build import build_demo

    path = build_demo(root).root / "chat-data.jsonl"
    if not path.exists():
        write_chat_data(path)
    return path
