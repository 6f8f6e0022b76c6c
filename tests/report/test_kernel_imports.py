"""A fresh kernel's warm-up: the training stack its notebooks import (peft, bitsandbytes, the Trainer) is imported
before the freeze where the diagnosis runs a notebook that imports it, and only there."""

import json
import os
import subprocess
import sys

import pytest

from workbench.model.shared import NOTEBOOKS_ENV

PROBE = """
import gc, json, sys
from workbench.report.kernel_imports import WARM_UP
exec(compile(WARM_UP, "<kernel warm-up>", "exec"), {})
heavy = ("peft", "bitsandbytes", "transformers.trainer")
imported = {name: name in sys.modules for name in heavy}
tracked = {id(o) for o in gc.get_objects()}  # the permanent generation (frozen) is not listed
frozen = {name: id(vars(sys.modules[name])) not in tracked for name in heavy if name in sys.modules}
print(json.dumps({"imported": imported, "frozen": frozen}))
"""


def warmed_up(notebooks: str) -> dict:
    env = {**os.environ, NOTEBOOKS_ENV: notebooks}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three processes importing the stack
def test_the_training_stack_is_imported_and_frozen_only_where_a_notebook_imports_it():
    planned = warmed_up("00_saved_files,01_dtype_distribution")
    assert all(planned["imported"].values()), planned
    assert all(planned["frozen"].values()), planned  # out of every later collection's scan
    for without in ("00_saved_files,07_data_path", "04_forward_checks"):  # the last prepares the model
        warm = warmed_up(without)
        assert not any(warm["imported"].values()), (without, warm)
