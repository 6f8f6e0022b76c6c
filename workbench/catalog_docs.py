"""The catalog's documentation, generated: the README's catalog table and docs/checks.md.

    python -m workbench.catalog_docs          # rewrite both (what `make docs` runs)
    python -m workbench.catalog_docs --check  # exit 1 naming the stale file (the tests run this)

Nothing here is hand-edited: a check's question, verdicts and detail live in `workbench.catalog`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from workbench.catalog import CHECKS, NOTEBOOKS, markdown_table

REPO = Path(__file__).resolve().parents[1]
README_START = "<!-- catalog: generated from workbench/catalog.py by `make docs`; a test keeps it equal -->"
README_END = "<!-- /catalog -->"


def checks_markdown() -> str:
    """docs/checks.md: the catalog table, then every check in detail, notebook by notebook."""
    lines = ["# Checks", "", "<!-- generated from workbench/catalog.py by `make docs`: edit the catalog, not this file -->",
             "", "Verdicts: `pass`, `info`, `warn`, `fail` (the probe ran and found a defect), `error` (the probe "
             "could not run), `skip` (nothing to check). `python -m workbench checks --where ID` prints where a "
             "check's probe, result class and tests live.", "", markdown_table(), ""]
    for nb in NOTEBOOKS:
        checks = [c for c in CHECKS if c.notebook == nb.name]
        if not checks:
            continue
        lines += [f"## {nb.title}", ""]
        for c in checks:
            steps = ", ".join(f"`{s.name}` (`{s.probe}`)" for s in c.steps)
            lines += [f"### `{c.id}`", "", f"**{c.question}**", "", c.detail, "", f"Step: {steps}.", ""]
            lines += [f"- `{verdict}`: {meaning}" for verdict, meaning in c.verdicts.items()] + [""]
    return "\n".join(lines)


def readme_with_catalog(readme: str) -> str:
    start = readme.index(README_START) + len(README_START)
    end = readme.index(README_END, start)
    return readme[:start] + "\n" + markdown_table() + "\n" + readme[end:]


def expected_files(repo: Path = REPO) -> dict[Path, str]:
    return {repo / "README.md": readme_with_catalog((repo / "README.md").read_text(encoding="utf-8")),
            repo / "docs" / "checks.md": checks_markdown()}


def main(argv: list[str]) -> int:
    stale = []
    for path, text in expected_files().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if "--check" in argv:
            stale.append(str(path.relative_to(REPO)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
