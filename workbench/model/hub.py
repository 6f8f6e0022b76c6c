"""Hub ids (`org/name`) as checkpoints, adapters and bases, through huggingface_hub.

What is downloaded: the configs, tokenizer files and other small files of a model repo, and all of an adapter repo
(its weights are what is diagnosed). A base's weights are not: their safetensors headers are read by HTTP range
requests (`hub_headers`) and recorded per commit, so the saved-files notebook and the header census run without
them. `download=True` (`--download`) fetches the whole repo, and every notebook can load the model.

Access modes: "cache" (the notebook kernels, and a user who set HF_HUB_OFFLINE=1) looks in the local Hugging Face
cache only; "headers" and "download" (the CLI) reach the hub at HF_ENDPOINT. The process stays offline otherwise
(`runtime.quiet_and_offline`); only the calls made here are let through, under `hub_online()`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
from pathlib import Path
from typing import Iterator

from workbench.errors import UsageError
from workbench.model.hub_headers import RemoteWeights, fetch_header, read_record, record_path, write_record
from workbench.paths import cache_root

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_MODES = ("cache", "headers", "download")
# weight files a model repo may hold: left on the hub unless --download (PyTorch, TF, Flax, ONNX, GGUF, Rust)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf",
                   "*.ot", "*.tflite", "*.pb")
ADAPTER_WEIGHTS = ("adapter_model*",)
# the notebooks that read files and headers alone (00: configs, tokenizer, adapter weights, the base's headers on a
# meta skeleton); the later ones prepare the model, load the recipes' (05) or the ranks' (06) models, or build
# batches through your set-up (07), which may load it
HEADERS_ONLY_NOTEBOOKS = ("00",)
SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>.+)$")  # huggingface_hub's repo_folder_name


def is_hub_id(ref: str) -> bool:
    return bool(HUB_ID.match(ref)) and not Path(ref).expanduser().exists()


def is_weight_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in WEIGHT_PATTERNS)


@contextlib.contextmanager
def hub_online() -> Iterator[None]:
    """huggingface_hub's offline switch off for the calls inside (it reads `constants.HF_HUB_OFFLINE` per request,
    huggingface_hub 2.4 utils/_http.py `hf_request_event_hook`)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def remote_weights(folder: Path) -> RemoteWeights | None:
    """The recorded weight files of a hub snapshot folder (`…/models--ORG--NAME/snapshots/COMMIT`) fetched without
    its weights; None for any other folder."""
    folder = Path(folder)
    match = SNAPSHOT.match(folder.parent.parent.name) if folder.parent.name == "snapshots" else None
    if match is None:
        return None
    return read_record(record_path(cache_root(), f"{match['org']}/{match['name']}", folder.name))


def offline_error(what: str, ref: str, why: str = "") -> UsageError:
    return UsageError(
        f"{what} {ref!r} is not a local folder; it looks like a Hugging Face hub id, and the hub cannot be reached "
        f"from here{why or ' (offline)'} nor holds the local cache a copy. Download it where you have network "
        f"(`hf download {ref} --local-dir DIR`) and pass DIR")


def resolve_hub(ref: str, *, what: str, mode: str = "cache") -> Path:
    """A local folder for hub id `ref`: the snapshot in the Hugging Face cache, fetched first unless mode is
    "cache". Unreachable and not cached: the one-line offline error (exit 2)."""
    from huggingface_hub import snapshot_download

    if mode not in HUB_MODES:
        raise ValueError(f"hub access mode {mode!r}: one of {HUB_MODES}")
    if mode != "cache":
        folder = _fetch(ref, what=what, download=mode == "download")
        if folder is not None:
            return folder
    try:
        return Path(snapshot_download(ref, local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss in the cache means: not available offline
        pass
    try:  # fetched without its weights: complete but for them, and their headers recorded
        folder = Path(snapshot_download(ref, local_files_only=True, ignore_patterns=list(WEIGHT_PATTERNS)))
    except Exception:  # noqa: BLE001
        raise offline_error(what, ref) from None
    if remote_weights(folder) is None:
        raise offline_error(what, ref)
    return folder


def _fetch(ref: str, *, what: str, download: bool) -> Path | None:
    """The snapshot fetched from the hub (None when the hub cannot be reached); a repo the hub does not have is a
    UsageError naming it."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        with hub_online():
            folder = Path(snapshot_download(ref, ignore_patterns=None if download else list(WEIGHT_PATTERNS)))
            if download:
                return folder
            if (folder / "adapter_config.json").exists():  # an adapter: its weights are the diagnosis
                return Path(snapshot_download(ref, revision=folder.name, allow_patterns=list(ADAPTER_WEIGHTS)))
            if remote_weights(folder) is None:
                _record_headers(ref, folder)
            return folder
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as exc:
        raise UsageError(f"{what} {ref!r}: the hub at {constants.ENDPOINT} has no such model repository, or it is "
                         f"gated or private ({type(exc).__name__}); check the hub id, or log in (`hf auth login`)"
                         ) from None
    except Exception:  # noqa: BLE001 - unreachable, timed out, offline: the caller falls back to the local cache
        return None


def _record_headers(ref: str, folder: Path) -> None:
    """Read the headers of the weight files from_pretrained would read (the index's shards, else model.safetensors)
    and record them with the repo's listing under the snapshot's commit."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    commit = folder.name
    files = {f.path: int(f.size or 0) for f in HfApi().list_repo_tree(ref, revision=commit)
             if isinstance(f, RepoFile)}
    index = folder / "model.safetensors.index.json"
    if index.exists():
        wanted = sorted(set((json.loads(index.read_text()).get("weight_map") or {}).values()))
    else:
        wanted = ["model.safetensors"] if "model.safetensors" in files else \
            sorted(n for n in files if n.endswith(".safetensors"))
    headers = [fetch_header(ref, name, commit) for name in wanted if name in files]
    write_record(record_path(cache_root(), ref, commit), ref, commit, files, headers)


def weights_left_on_hub(folder: Path) -> tuple[int, int] | None:
    """(files, bytes) of the weight files a snapshot holds on the hub and not locally; None when it is complete."""
    remote = remote_weights(folder)
    if remote is None:
        return None
    missing = {n: s for n, s in remote.files.items() if is_weight_file(n) and not (folder / n).exists()}
    return (len(missing), sum(missing.values())) if missing else None
