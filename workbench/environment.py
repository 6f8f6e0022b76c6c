"""The software a report was made with. Only named variables are read, and secrets are redacted."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from typing import Any

LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "safetensors", "papermill",
             "nbconvert")
VARIABLES = ("CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_TOKEN",
             "WORLD_SIZE", "LOCAL_RANK")
SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD)", re.I)


def redact(name: str, value: str) -> str:
    return "***redacted***" if SECRET_NAME.search(name) else value


def secret_values() -> list[str]:
    """Values of environment variables whose names look secret (tokens, keys, passwords), longest first."""
    values = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 6}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, secrets: list[str] | None = None) -> str:
    for value in secrets if secrets is not None else secret_values():
        text = text.replace(value, "***redacted***")
    return text


def library_versions() -> dict[str, str | None]:
    """Each library's version: the `__version__` of a library this process has imported (what runs), else its
    installed distribution's metadata (parsing a METADATA file costs about 1 ms; the training callback's report
    asks at every save)."""
    versions: dict[str, str | None] = {}
    for lib in LIBRARIES:
        loaded = getattr(sys.modules.get(lib), "__version__", None)
        if isinstance(loaded, str):
            versions[lib] = loaded
            continue
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[lib] = None
    return versions


def host_available_bytes() -> tuple[int, str]:
    """The machine's MemAvailable (where /proc says it), else its available physical pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable of this machine"
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "available physical pages"


def environment_facts() -> dict[str, Any]:
    import torch

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return {"python": sys.version.split()[0], **library_versions(), "cuda": cuda, "gpus": gpus,
            "platform": platform.platform(),
            "variables": {k: redact(k, os.environ[k]) for k in VARIABLES if k in os.environ}}
