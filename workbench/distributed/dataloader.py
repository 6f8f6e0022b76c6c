"""DataLoader workers under torchrun: the start method they get, and whether a collate touching CUDA survives them.

Rank 0 collects `data_loading_facts()` inside its DDP section (`workbench.distributed.ddp`); `data_loading_text`
turns them into the sentence the `distributed.ddp` finding ends with ('Cannot re-initialize CUDA in forked
subprocess' and its fixes).
"""

from __future__ import annotations

import sys
from typing import Any

from workbench.distributed.train_step import short_error


def _cuda_collate(batch):
    import torch

    return torch.tensor(batch, device="cuda")  # touches CUDA inside the worker


def data_loading_facts() -> dict[str, Any]:
    """The start method DataLoader workers get, and, on a GPU, whether a collate touching CUDA survives them."""
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader

    chosen = multiprocessing.get_start_method(allow_none=True)
    method = chosen or multiprocessing.get_all_start_methods()[0]  # the first is the platform's default
    facts: dict[str, Any] = {"start_method": method, "set_explicitly": chosen is not None,
                             "python": sys.version.split()[0]}
    if not torch.cuda.is_available():
        facts["cuda_collate"] = {"tested": False, "reason": (
            "no CUDA device on this machine: 'Cannot re-initialize CUDA in forked subprocess' needs CUDA "
            "initialised in the parent before its DataLoader workers fork")}
        return facts
    torch.cuda.init()
    loader = DataLoader([1, 2], batch_size=1, num_workers=1, collate_fn=_cuda_collate, timeout=60)
    try:
        next(iter(loader))
        facts["cuda_collate"] = {"tested": True, "fails": False}
    except Exception as exc:  # noqa: BLE001 - the failure is the fact
        facts["cuda_collate"] = {"tested": True, "fails": True, "error": short_error(exc)[:300],
                                 "reinit_error": "Cannot re-initialize CUDA in forked subprocess" in str(exc)}
    return facts


def data_loading_text(facts: dict[str, Any] | None) -> str:
    """The finding's sentence on DataLoader workers; empty when no rank collected the facts."""
    if not facts:
        return ""
    cuda = facts.get("cuda_collate") or {}
    if not cuda.get("tested"):
        tail = "whether a collate touching CUDA survives them is tested on GPU machines only"
    elif cuda.get("fails"):
        tail = (f"a collate touching CUDA fails in them ({cuda.get('error')}): keep CUDA out of collate_fn (move the "
                "batch in the training step) or DataLoader(multiprocessing_context='spawn')")
    else:
        tail = "a collate touching CUDA works in them"
    return f" DataLoader workers start with {facts['start_method']!r}; {tail}."
