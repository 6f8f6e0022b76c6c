"""Where users already are: the workbench inside a training script.

    from workbench.integrations import WorkbenchCallback
    Trainer(..., callbacks=[WorkbenchCallback(raise_on="fail")])

Names load on first use (PEP 562): importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WorkbenchCallback", "WorkbenchStop"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from workbench.integrations import callback

        return getattr(callback, name)
    raise AttributeError(f"module 'workbench.integrations' has no attribute {name!r}")
