"""Each family's artifacts, built once per test session and shared by the xdist workers (a file lock in the
session's common temporary folder: the first worker to ask builds, the others read what it wrote)."""

from __future__ import annotations

import pytest

from tests.entry_forms.artifacts import Artifacts, build
from tests.shared_builds import built_once, shared_demo, shared_root


@pytest.fixture(scope="session")
def artifacts_of(tmp_path_factory):
    """family -> its Artifacts (built on first use; every worker of the session gets the same folders)."""
    (shared_root(tmp_path_factory) / "entry-forms").mkdir(parents=True, exist_ok=True)
    cache: dict[str, Artifacts] = {}

    def get(family: str) -> Artifacts:
        if family not in cache:
            with built_once(tmp_path_factory, f"entry-forms/{family}") as folder:
                if (folder / "artifacts.json").exists():
                    cache[family] = Artifacts.load(folder)
                else:
                    demo_base = shared_demo(tmp_path_factory).qwen_base if family == "qwen2_vl" else None
                    cache[family] = build(family, folder.parent, demo_base)
        return cache[family]

    return get
