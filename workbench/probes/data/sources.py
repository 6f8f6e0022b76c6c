"""Reading the training data: a JSONL file or a folder written by `datasets.save_to_disk`, streamed.

    source = open_source("train.jsonl")        # format, row count, first row; nothing else is read
    for row in source.rows(limit=1000): ...     # plain dicts, one at a time
    source.iterable(limit=1000)                 # the same rows as a datasets.IterableDataset (for trl's preparation)

Formats, by the first row's keys (trl's own dataset types): `messages` (conversational language modeling),
`prompt` + `completion` (standard or conversational), `text` (already rendered), `input_ids` (pre-tokenized,
with or without `labels`). Memory does not grow with the file: JSONL is read line by line, a saved dataset is
memory-mapped by Arrow.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

from workbench.errors import UsageError

FORMATS = ("messages", "prompt-completion", "text", "tokenized")


def row_format(row: dict[str, Any]) -> str:
    if "input_ids" in row:
        return "tokenized"
    if "messages" in row:
        return "messages"
    if "prompt" in row and "completion" in row:
        return "prompt-completion"
    if "text" in row:
        return "text"
    raise UsageError(f"--data: a row with keys {sorted(row)} is none of the formats the workbench reads: "
                     "`messages` (a list of {role, content}), `prompt` + `completion`, `text`, or `input_ids`")


def is_conversational(row: dict[str, Any]) -> bool:
    value = row.get("messages", row.get("prompt"))
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


@dataclasses.dataclass
class DataSource:
    path: Path
    kind: str  # "jsonl" | "saved"
    format: str
    conversational: bool
    total: int  # rows in the file or dataset
    first: dict[str, Any]

    def rows(self, limit: int | None = None) -> Iterator[dict[str, Any]]:
        if self.kind == "jsonl":
            rows = _jsonl_rows(self.path)
        else:
            rows = iter(_load_saved(self.path))
        return itertools.islice(rows, limit) if limit else rows

    def count(self, limit: int | None = None) -> int:
        return min(self.total, limit) if limit else self.total

    def iterable(self, limit: int | None = None):
        """The rows as a `datasets.IterableDataset` (lazy: trl's preparation maps it row by row)."""
        from datasets import IterableDataset

        if self.kind == "saved":
            dataset = _load_saved(self.path).to_iterable_dataset()
        else:
            dataset = IterableDataset.from_generator(_jsonl_rows, gen_kwargs={"path": self.path})
        return dataset.take(limit) if limit else dataset

    def describe(self) -> str:
        return (f"{self.path.name}: {self.total:,} rows, {self.format}"
                f"{' (conversational)' if self.conversational and self.format != 'messages' else ''}")


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"--data {path}: line {number} is not JSON ({exc})") from None


def _load_saved(path: Path):
    from datasets import DatasetDict, load_from_disk

    dataset = load_from_disk(str(path))
    if isinstance(dataset, DatasetDict):
        if "train" not in dataset:
            raise UsageError(f"--data {path}: a DatasetDict without a 'train' split ({list(dataset)})")
        dataset = dataset["train"]
    return dataset


def open_source(path: str | Path) -> DataSource:
    path = Path(path).expanduser()
    if path.is_dir():
        if not (path / "dataset_info.json").exists() and not (path / "dataset_dict.json").exists():
            raise UsageError(f"--data {path} is a folder but not one written by datasets.save_to_disk "
                             "(no dataset_info.json / dataset_dict.json)")
        dataset = _load_saved(path)
        if not len(dataset):
            raise UsageError(f"--data {path}: the dataset has no rows")
        first, total, kind = dataset[0], len(dataset), "saved"
    elif path.is_file():
        first = next(_jsonl_rows(path), None)
        if first is None:
            raise UsageError(f"--data {path}: the file has no rows")
        with open(path, "rb") as handle:
            total = sum(1 for line in handle if line.strip())
        kind = "jsonl"
    else:
        raise UsageError(f"--data {path} does not exist")
    if not isinstance(first, dict):
        raise UsageError(f"--data {path}: rows must be JSON objects, got {type(first).__name__}")
    return DataSource(path, kind, row_format(first), is_conversational(first), total, first)
