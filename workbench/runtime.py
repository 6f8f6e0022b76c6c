"""Process-wide settings for a diagnosis: offline, quiet. Called by the CLI and by every notebook."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings


def quiet_and_offline() -> None:
    # the workbench never downloads: hub lookups must be served by the local cache
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")
    for name in ("transformers", "peft", "accelerate", "bitsandbytes", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # transformers reads TRANSFORMERS_VERBOSITY and the hub's progress-bar switch when it is imported; only a
    # transformers imported before this call needs telling (importing it here would cost every CLI start ~1 s)
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def skip_slow_optional_imports() -> None:
    """Keep optional imports that cost seconds and serve nothing here out of this process.

    `rfc3987_syntax` (1.1.0, pulled in by jupyter-events' `jsonschema[format-nongpl]`) compiles ~40 lark grammars
    when imported: 1.7 s of every `import papermill` / `import nbformat` on 2 cores, through jsonschema 4.26's
    `_format.py`, which imports it only to check the "iri" string format — nbformat's notebook validation never
    asks for it. jsonschema imports it inside `suppress(ImportError)`, so a None in sys.modules just leaves that
    format unchecked. For the CLI's own process; a user's JupyterLab is left alone."""
    sys.modules.setdefault("rfc3987_syntax", None)


@contextlib.contextmanager
def environment_as_found(variables: dict[str, str] | None = None):
    """This process' environment with `variables` set for the block, then as it was: every variable the block set
    or replaced is put back, those the stack sets on the way included. transformers 5.23's TrainingArguments
    (training_args.py `_process_fsdp_args`) and accelerate 1.15's FSDP plugin (utils/dataclasses.py) write
    FSDP_CPU_RAM_EFFICIENT_LOADING for the processes a launch would start; built to be read, they would otherwise
    leave it in a kernel, a notebook's process or the caller's."""
    before = dict(os.environ)
    os.environ.update(variables or {})
    try:
        yield
    finally:
        restore_environment(before)


def restore_environment(environment: dict[str, str]) -> None:
    """This process' environment made exactly `environment`: variables it lacks removed, the others set."""
    for name in [n for n in os.environ if n not in environment]:
        del os.environ[name]
    for name, value in environment.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
