"""`workbench explain`: from the error text a user holds to its ranked causes, confirmed on their model.

In JupyterLab the package itself is the call, rendered like a finding:

    import workbench as wb
    wb.explain(traceback_text)                          # the symptom, the causes ranked, their checks and fixes
    wb.explain(traceback_text, ckpt="out/checkpoint-500", setup="qlora")   # confirmed on the model: a report too
    %load_ext workbench                                 # then: %workbench explain crash.log, or a %%workbench explain
                                                        # cell holding the pasted text
"""

from __future__ import annotations

import argparse
import sys
import types
from typing import Any


def explain(text: Any, ckpt: str | None = None, **options: Any):
    """The explanation of `text` (a string or a file object); with `ckpt`, the named checks run on that model and
    the report is written as `workbench explain --ckpt` writes it (options: base, setup, quant, gpus,
    training_args, data, reports_dir, reproduce)."""
    from workbench.explain.ranking import explain_text

    explanation = explain_text(text)
    if ckpt is not None and explanation.seen is not None:
        from workbench.explain.command import OPTIONS

        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(f"explain: unknown options {sorted(unknown)}; use {sorted(OPTIONS)}")
        args = argparse.Namespace(**{**OPTIONS, **options, "ckpt": str(ckpt), "user_offline": False})
        from workbench.explain.confirm import confirm

        confirm(explanation, args)
        if args.reproduce:
            from workbench.explain.reproduce import reproduce_for

            explanation.reproduction = reproduce_for(explanation, args)
    return explanation


class _CallableModule(types.ModuleType):
    """`workbench.explain` is both this package and the call: `wb.explain(text)`."""

    def __call__(self, text: Any, ckpt: str | None = None, **options: Any):
        return explain(text, ckpt, **options)


sys.modules[__name__].__class__ = _CallableModule
