"""`workbench explain [FILE | -]`: read the text, print the symptom and its causes ranked (or JSON); with `--ckpt`,
run the checks the causes name on the user's model; with `--reproduce`, replay the failing step on a tiny twin.

Exit codes: 0 when the text was read (a known symptom or not), 1 when `--ckpt` confirmed a cause, 2 on unreadable
input or bad options (one line, no traceback)."""

from __future__ import annotations

import json
import os
import sys

from workbench.errors import UsageError

# `--ckpt`'s options and their defaults, as `workbench explain` parses them (a test keeps them equal to the parser):
# what `wb.explain(text, ckpt=…, **options)` accepts in a notebook
OPTIONS = {"base": None, "setup": None, "quant": None, "gpus": None, "training_args": None, "data": None,
           "reports_dir": "reports", "reproduce": False}


def _open_input(path: str):
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("explain: no text given; pass a file (workbench explain crash.log) or pipe it in "
                             "(… 2>&1 | workbench explain -)")
        return sys.stdin.buffer
    if os.path.isdir(path):
        raise UsageError(f"explain {path}: a folder; pass the log or traceback file (a Trainer output_dir's "
                         "trainer_state.json works too)")
    try:
        fh = open(path, "rb")  # noqa: SIM115 - streamed, closed by the caller
    except OSError as exc:
        raise UsageError(f"explain {path}: cannot read it ({exc.strerror}); pass a readable text file or -") from None
    head = fh.read(8192)
    fh.seek(0)
    if b"\x00" in head:
        fh.close()
        raise UsageError(f"explain {path}: a binary file, not text; pass the log or traceback as text")
    return fh


def explain_command(args) -> int:
    from workbench.explain.ranking import explain_text

    if args.list:
        from workbench.explain.view import symptom_list_text

        print(symptom_list_text())
        return 0
    if args.reproduce and not args.ckpt:
        raise UsageError("--reproduce builds a tiny twin of your model's family: pass --ckpt CKPT (a folder with "
                         "config.json, or an adapter folder)")
    source = _open_input(args.file)
    try:
        explanation = explain_text(source)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if explanation.reading.characters == 0:
        raise UsageError(f"explain {args.file}: the text is empty; paste the traceback or the log tail")
    code = 0
    if args.ckpt and explanation.seen is not None:
        from workbench.explain.confirm import confirm

        try:
            code = confirm(explanation, args)
        except UsageError as exc:
            if not args.reproduce:
                raise
            # a config alone (no weights) still gives a twin: the reproduction goes on, the checks cannot run
            explanation.confirmation = {"target": args.ckpt, "checks": [], "notebooks": [], "seconds": 0.0,
                                        "report": None, "not_run": str(exc)}
    if args.reproduce and explanation.seen is not None:
        from workbench.explain.reproduce import reproduce_for

        explanation.reproduction = reproduce_for(explanation, args)
    if (args.ckpt or args.reproduce) and explanation.seen is None:
        print("no known symptom: --ckpt / --reproduce ran nothing (they confirm or replay a recognised symptom's "
              "causes)", file=sys.stderr)
    if args.json:
        print(json.dumps(explanation.as_dict(), indent=2, default=str, allow_nan=False))
    else:
        print(str(explanation))
    return code
