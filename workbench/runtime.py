"""Process-wide settings for a diagnosis: offline, quiet. Called by the CLI and by every notebook."""

from __future__ import annotations

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
