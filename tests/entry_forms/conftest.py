"""Each family's artifacts, built once per test session and shared by the xdist workers (a file lock in the
session's common temporary folder: the first worker to ask builds, the others read what it wrote)."""

from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock

from tests.entry_forms.artifacts import Artifacts, build
from tests.shared_builds import shared_demo, shared_root


def entry_forms_root(tmp_path_factory) -> Path:
    return shared_root(tmp_path_factory) / "entry-forms"


@pytest.fixture(scope="session")
def artifacts_of(tmp_path_factory):
    """family -> its Artifacts (built on first use; every worker of the session gets the same folders)."""
    root = entry_forms_root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    cache: dict[str, Artifacts] = {}

    def get(family: str) -> Artifacts:
        if family not in cache:
            with FileLock(str(root / f"{family}.lock")):
                if (root / family / "artifacts.json").exists():
                    cache[family] = Artifacts.load(root / family)
                else:
                    demo_base = None
                    if family == "qwen2_vl":
                        demo_base = shared_demo(tmp_path_factory).qwen_base
                    cache[family] = build(family, root, demo_base)
        return cache[family]

    return get
