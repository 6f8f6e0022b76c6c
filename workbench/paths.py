"""Where the project's folders are, said once: the package, the checkout around it, its notebooks."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent  # the checkout (or the folder holding the installed package)
NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"
REPORT_TEMPLATE_DIR = PACKAGE_DIR / "report" / "template"
