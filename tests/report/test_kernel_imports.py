"""A fresh kernel's warm-up: the training stack its notebooks import (peft, bitsandbytes, the Trainer) is imported
before the freeze where the diagnosis runs a notebook that imports it, and only there; the cyclic collector is off
while the stack imports, and on after it."""

import json
import os
import subprocess
import sys

import pytest

from workbench.model.shared import NOTEBOOKS_ENV

# One fresh process, the warm-up run as a kernel runs it: first for a diagnosis of notebooks that import neither
# (00 and 07; then 04, which prepares the model, asked of the same function), then again once the diagnosis' notebooks
# include 01: its imports are then done and frozen. The stack is imported once, not once per plan.
PROBE = """
import gc, json, os, sys
from workbench.report.kernel_imports import WARM_UP, import_the_training_stack_if_planned
heavy = ("peft", "bitsandbytes", "transformers.trainer")

def imported():
    return {name: name in sys.modules for name in heavy}

collections = []  # started once torch's import began and before the warm-up's freeze (none is frozen until then)
gc.callbacks.append(lambda phase, info: collections.append(info["generation"])
                    if phase == "start" and "torch" in sys.modules and not gc.get_freeze_count() else None)
assert "torch" not in sys.modules
exec(compile(WARM_UP, "<kernel warm-up>", "exec"), {})
collected_while_importing = len(collections)
without = {os.environ[NOTEBOOKS_ENV]: imported()}
import_the_training_stack_if_planned("04_forward_checks")
without["04_forward_checks"] = imported()
os.environ[NOTEBOOKS_ENV] = "00_saved_files,01_dtype_distribution"
exec(compile(WARM_UP, "<kernel warm-up>", "exec"), {})
tracked = {id(o) for o in gc.get_objects()}  # the permanent generation (frozen) is not listed
frozen = {name: id(vars(sys.modules[name])) not in tracked for name in heavy if name in sys.modules}
enabled = gc.isenabled()
sys.modules["pandas"] = None  # an import of the warm-up that fails
try:
    exec(compile(WARM_UP, "<kernel warm-up>", "exec"), {})
except ImportError:
    pass
print(json.dumps({"without": without, "planned": imported(), "frozen": frozen, "enabled": enabled,
                  "collected_while_importing": collected_while_importing, "enabled_after_a_failure": gc.isenabled()}))
""".replace("NOTEBOOKS_ENV", repr(NOTEBOOKS_ENV))


@pytest.mark.slow  # a process importing the stack
def test_the_training_stack_is_imported_and_frozen_only_where_a_notebook_imports_it():
    env = {**os.environ, NOTEBOOKS_ENV: "00_saved_files,07_data_path"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=True)
    warm = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(warm["without"]) == {"00_saved_files,07_data_path", "04_forward_checks"}, warm
    for plan, imported in warm["without"].items():
        assert not any(imported.values()), (plan, imported)
    assert all(warm["planned"].values()), warm
    assert set(warm["frozen"]) == set(warm["planned"]) and all(warm["frozen"].values()), warm  # out of every scan
    # no collection scanned the objects the imports were making (the collector was off), and it is on after them,
    # even when an import failed
    assert warm["collected_while_importing"] == 0 and warm["enabled"] and warm["enabled_after_a_failure"], warm
