"""A hub checkpoint's safetensors headers read by HTTP range requests, recorded once per commit.

The requests are huggingface_hub's own (`HfApi.parse_safetensors_file_metadata`, huggingface_hub 2.4): the first
100,000 bytes with `Range`, and a second range only when the header is longer. We make them through the same client
(`get_session`, `build_hf_headers`, `hf_raise_for_status`) rather than calling that function because the checks of
`checkpoint.integrity` need what it drops: the header's exact bytes and the file's size (the `Content-Range` total),
so that a hub file gets the same layout checks (truncation, overlaps, sizes) as a local one.

A commit is immutable, so its headers are recorded under the workbench cache (`hub-headers/ORG--NAME/COMMIT.json`):
a notebook kernel, which runs offline, reads them from there.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from workbench.model.safetensors_header import SafetensorsHeader, header_length, parse_header

FIRST_RANGE_BYTES = 100_000  # huggingface_hub's first request (hf_api.py, parse_safetensors_file_metadata)
CONTENT_RANGE_TOTAL = re.compile(r"/(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class RemoteHeader:
    filename: str
    file_size: int
    raw: bytes  # the header's JSON bytes, after the 8-byte length
    bytes_transferred: int  # what the range requests returned (the first 100 kB includes tensor data)

    def parse(self, folder: Path) -> SafetensorsHeader:
        return parse_header(folder / self.filename, self.raw, self.file_size)


def fetch_header(repo_id: str, filename: str, commit: str, *, endpoint: str | None = None) -> RemoteHeader:
    """One file's header by range requests at `commit`. HTTP errors are huggingface_hub's own exceptions."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint)
    headers = build_hf_headers()
    first = get_session().get(url, headers={**headers, "range": f"bytes=0-{FIRST_RANGE_BYTES}"})
    hf_raise_for_status(first)
    content = first.content
    total = CONTENT_RANGE_TOTAL.search(first.headers.get("content-range", ""))
    file_size = int(total.group(1)) if first.status_code == 206 and total else len(content)
    header_size = header_length(f"{repo_id}/{filename}", content[:8], file_size)
    transferred = len(content)
    if 8 + header_size <= len(content):
        raw = content[8:8 + header_size]
    else:
        rest = get_session().get(url, headers={**headers, "range": f"bytes=8-{header_size + 7}"})
        hf_raise_for_status(rest)
        raw = rest.content
        transferred += len(raw)
    return RemoteHeader(filename, file_size, raw, transferred)


def record_path(cache: Path, repo_id: str, commit: str) -> Path:
    return cache / "hub-headers" / repo_id.replace("/", "--") / f"{commit}.json"


def write_record(path: Path, repo_id: str, commit: str, files: dict[str, int], headers: list[RemoteHeader]) -> None:
    """`files`: every top-level file of the repo at `commit` with its size (the listing); `headers`: the
    safetensors headers read."""
    from workbench.findings import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"repo_id": repo_id, "commit": commit, "files": files,
                             "headers": {h.filename: {"file_size": h.file_size, "header": h.raw.decode("utf-8"),
                                                      "bytes_transferred": h.bytes_transferred}
                                         for h in headers}})


@dataclasses.dataclass(frozen=True)
class RemoteWeights:
    """The weight files of a hub snapshot whose weights were not downloaded: names, sizes and headers."""

    repo_id: str
    commit: str
    files: dict[str, int]  # every top-level file of the repo -> size in bytes
    headers: dict[str, RemoteHeader]

    def header(self, folder: Path, filename: str) -> SafetensorsHeader | None:
        remote = self.headers.get(filename)
        return remote.parse(folder) if remote is not None else None

    @property
    def bytes_transferred(self) -> int:
        return sum(h.bytes_transferred for h in self.headers.values())


def read_record(path: Path) -> RemoteWeights | None:
    try:
        data = json.loads(path.read_text())
        headers = {name: RemoteHeader(name, int(h["file_size"]), h["header"].encode("utf-8"),
                                      int(h.get("bytes_transferred", 0)))
                   for name, h in data["headers"].items()}
        return RemoteWeights(data["repo_id"], data["commit"], {k: int(v) for k, v in data["files"].items()}, headers)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
