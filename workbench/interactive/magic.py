"""The IPython magic: `%load_ext workbench`, then

    %workbench explain crash.log             # a file
    %%workbench explain                      # or the pasted text as the cell's body
    Traceback (most recent call last): …

renders the explanation as `wb.explain(text)` does (the symptom, the causes ranked, their checks and fixes)."""

from __future__ import annotations

import shlex
from pathlib import Path

USAGE = "usage: %workbench explain FILE  |  %%workbench explain (the text in the cell)"


def workbench_magic(line: str, cell: str | None = None):
    from workbench.explain import explain

    words = shlex.split(line)
    if not words or words[0] != "explain":
        print(USAGE)
        return None
    if cell is not None and cell.strip():
        return explain(cell)
    if len(words) == 2 and Path(words[1]).is_file():
        with open(words[1], "rb") as fh:
            return explain(fh)
    print(f"{USAGE}\n(no such file: {words[1]})" if len(words) == 2 else USAGE)
    return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(workbench_magic, "line_cell", "workbench")
