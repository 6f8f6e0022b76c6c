"""Hub ids against a local HTTP server in the Hub's file API (tests/hub/hub_server.py): the real huggingface_hub
client, real range requests, the bytes sent counted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import served_hub
from tests.hub.hub_server import HubServer


def run_workbench(*args, hub: HubServer | None, home: Path, cwd: Path | None = None, offline: bool = False):
    """`python -m workbench ARGS` with the hub at `hub.endpoint` (an unreachable port when None), the Hugging Face
    cache and the workbench cache under `home`."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub.endpoint if hub else "http://127.0.0.1:9", HF_HOME=str(home / "hf"),
               WORKBENCH_CACHE=str(home / "wb-cache"), **served_hub.TIMEOUTS)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or home, env=env, timeout=600, stdin=subprocess.DEVNULL)


def cached_files(home: Path) -> set[str]:
    """The names of every file the Hugging Face cache holds (snapshot links and blobs' link names)."""
    return {p.name for p in (home / "hf").rglob("*") if p.is_file() or p.is_symlink()}


def as_hub_adapter(adapter: Path, out: Path, base_id: str) -> Path:
    """A copy of a PEFT adapter folder whose adapter_config.json records `base_id` as its base."""
    shutil.copytree(adapter, out)
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base_id
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def empty_home(tmp_path: Path) -> Path:
    """A home with an empty Hugging Face cache for one test: this process' (tests/served_hub.py), the one its kernel
    server imported under, where that Hub runs; else a folder of the test's own."""
    home = served_hub.fresh_home()
    if home is None:
        home = tmp_path / "home"
        home.mkdir()
    return home


@pytest.fixture
def hub_home(tmp_path) -> Path:
    return empty_home(tmp_path)
