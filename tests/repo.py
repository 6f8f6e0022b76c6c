"""The repository root, for tests that read its files (README, notebooks, parameters); and the folder whose
sitecustomize keeps slow optional imports out of the processes the suite starts whose imports it does not test
(tests/quick_site: put it first on their PYTHONPATH)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK_SITE = ROOT / "tests" / "quick_site"


def quick_python_path() -> str:
    """PYTHONPATH with tests/quick_site first, for a process the suite starts."""
    return os.pathsep.join(filter(None, [str(QUICK_SITE), os.environ.get("PYTHONPATH")]))
