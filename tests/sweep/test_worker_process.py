"""A `sweep --jobs N` worker is a spawned interpreter: it is prepared as the CLI's own process is before it imports
papermill (`local_engine.prepare_worker_process`), so its diagnoses skip the optional grammar compile."""

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor


def _what_papermill_pulled_in() -> dict:
    import papermill  # noqa: F401 - through nbformat's validator, jsonschema's format checkers

    return {"jsonschema formats": "jsonschema._format" in sys.modules,
            "rfc3987_syntax": repr(sys.modules.get("rfc3987_syntax", "absent"))}


def test_a_spawned_worker_imports_papermill_without_compiling_the_iri_grammars():
    from workbench.sweep.local_engine import prepare_worker_process

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=prepare_worker_process) as pool:
        seen = pool.submit(_what_papermill_pulled_in).result(timeout=300)
    assert seen == {"jsonschema formats": True, "rfc3987_syntax": "None"}, seen
