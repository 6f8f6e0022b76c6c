"""Where the project's folders are, said once: the package, the checkout around it, its notebooks, the cache.

In a clone the notebooks and the parameter files live beside the package (`notebooks/`, `parameters/`); an
installed wheel carries its own copies as package data (`workbench/notebooks/`, `workbench/parameters/`, mapped
from those folders by pyproject.toml). The package's copy wins when it exists, so an installed workbench never
picks up an unrelated `notebooks/` folder next to site-packages; a clone has none and reads its checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent  # the checkout (or the folder holding the installed package)


def _shipped_or_checkout(name: str) -> Path:
    shipped = PACKAGE_DIR / name
    return shipped if shipped.is_dir() else PROJECT_ROOT / name


NOTEBOOK_DIR = _shipped_or_checkout("notebooks")
PARAMETERS_DIR = _shipped_or_checkout("parameters")
REPORT_TEMPLATE_DIR = PACKAGE_DIR / "report" / "template"


def cache_root() -> Path:
    """The workbench's own cache (WORKBENCH_CACHE, else ~/.cache/workbench): header maps, hub headers."""
    return Path(os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench")
