"""`workbench sweep PATH… [--history] [diagnose's options] [--jobs N] [--engine local|ray] [--address HOST:PORT]`.

The sweep's folder is `reports/YYYY-MM-DD/HHMMSS-sweep-<name>/`, assembled hidden (`.partial`) and renamed when
whole, as a diagnosis' is:

    index.html          the comparison (notebooks/12_sweep.ipynb, executed there as 12_sweep.ipynb)
    sweep.json          engine, members (name, path, report, exit_code, verdicts), first_bad
    members/<name>/     each member's report, as `diagnose` writes it

Exit code: the worst member's (0 clean, 1 a fail or error, 2 a member that could not be diagnosed); bad input to the
sweep itself is one line and exit 2 before anything runs.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
from pathlib import Path

from workbench.errors import UsageError
from workbench.sweep.member_run import MemberOutcome, record_engine_cost
from workbench.sweep.members import Member, history_members, sweep_members
from workbench.sweep.verdicts import sweep_document, worst_exit


def sweep_command(args) -> int:
    from workbench.diagnose_command import check_diagnose_options

    _check_sweep_options(args)
    check_diagnose_options(args)
    members = history_members(args.paths) if args.history else sweep_members(args.paths)
    if args.engine == "ray":  # refused before any folder is made: Ray missing, nothing at --address
        from workbench.sweep.ray_engine import check_reachable, import_ray

        if args.address:
            check_reachable(args.address)
        import_ray()
    return run_sweep(members, args)


def _check_sweep_options(args) -> None:
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: members diagnosed at a time; use 1 or more")
    if args.engine != "ray" and (args.address or args.shared_dir):
        raise UsageError("--address and --shared-dir are the Ray engine's: add --engine ray")
    if args.engine == "ray" and args.jobs != 1:
        raise UsageError("--jobs is the local engine's: on Ray the cluster runs as many members at a time as its "
                         "resources hold")
    if args.shared_dir and not Path(args.shared_dir).is_dir():
        raise UsageError(f"--shared-dir {args.shared_dir}: no such folder; name a folder every Ray node sees")


def run_sweep(members: list[Member], args) -> int:
    from workbench.findings import write_json_atomic
    from workbench.report.contract import redact_report
    from workbench.report.index_page import write_reports_index
    from workbench.report.runner import new_report_folder
    from workbench.sweep.local_engine import series_kernel
    from workbench.sweep.page import write_comparison

    reports_dir = Path(args.reports_dir).resolve()
    name = f"sweep-{members[0].path.parent.name}" if args.history else f"sweep-{members[0].name}-{len(members)}"
    temp, final = new_report_folder(reports_dir, name, dt.datetime.now().astimezone())
    print(f"sweep of {len(members)} member(s) on the {args.engine} engine -> {final}", flush=True)
    kernel = None
    try:
        try:
            kernel = series_kernel(args)  # members in series share one kernel, and the page runs in it after them
            outcomes = _run_engine(members, args, temp / "members", _progress(len(members)), kernel)
        except BaseException:
            if kernel is not None:  # stopped first: a cell still running would write into the folder removed next
                kernel.close()
                kernel = None
            shutil.rmtree(temp, ignore_errors=True)  # refused by the engine, or interrupted: nothing half-made left
            raise
        for outcome in outcomes:
            record_engine_cost(outcome, args.engine)
        document = sweep_document(args.engine, outcomes, temp, args.history)
        write_json_atomic(temp / "sweep.json", document)
        page_error = write_comparison(temp, history=args.history, cell_timeout=args.cell_timeout, kernel=kernel)
    finally:
        if kernel is not None:
            kernel.close()
    redact_report(temp)
    os.replace(temp, final)
    write_reports_index(reports_dir)
    for check, member in document["first_bad"].items():
        print(f"first bad: {check} at {member}")
    if page_error:
        print(f"error: the comparison page failed ({page_error}); sweep.json and the members' reports are whole",
              file=sys.stderr)
    print(f"sweep report: {final / 'index.html'}")
    return max(worst_exit(outcomes), 1 if page_error else 0)


def _run_engine(members, args, members_dir: Path, finished, kernel) -> list[MemberOutcome]:
    if args.engine == "ray":
        from workbench.sweep.ray_engine import run_on_ray

        shared = Path(args.shared_dir).resolve() if args.shared_dir else None
        return run_on_ray(members, args, members_dir, address=args.address, shared_dir=shared, finished=finished)
    from workbench.sweep.local_engine import run_local

    return run_local(members, args, members_dir, jobs=args.jobs, finished=finished, kernel=kernel)


def _progress(total: int):
    done = []

    def finished(outcome: MemberOutcome) -> None:
        done.append(outcome.name)
        bad = sorted(c for c, v in outcome.verdicts.items() if v in ("fail", "error"))
        what = (outcome.error if outcome.error else ("fail/error: " + ", ".join(bad)) if bad else "clean")
        print(f"[{len(done)}/{total}] {outcome.name}: exit {outcome.exit_code} ({outcome.seconds:.1f} s"
              + (f", {len(outcome.attempts) + 1} attempts" if outcome.attempts else "") + f"): {what}", flush=True)

    return finished

