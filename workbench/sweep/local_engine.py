"""The local engine: the members on this machine, one after another, or `jobs` at a time in worker processes
(spawned: a fresh interpreter each, so no state of one diagnosis reaches another's).

One after another, the members share one kernel, and with `jobs` each worker process keeps one for the members it
runs: the stack's imports (torch, transformers, peft: about 5 s of CPU on 2 cores) are paid once per kernel, not per
member, and between two members the kernel is made as a fresh one would be (`Kernel.begin_diagnosis`,
`workbench.report.kernel_reset`, which says what it resets). A member whose notebook kills the kernel leaves the next
member a fresh one."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from workbench.sweep.member_run import USAGE_EXIT, MemberOutcome, diagnose_member
from workbench.sweep.members import Member


def run_local(members: list[Member], args: argparse.Namespace, members_dir: Path, *, jobs: int,
              finished: Callable[[MemberOutcome], None], kernel=None) -> list[MemberOutcome]:
    """Each member's outcome, in member order; `finished(outcome)` as each one ends. `kernel`: the members' kernel
    when they run one after another (`series_kernel`), left open for the caller (the sweep's page runs in it); one
    of their own otherwise, closed at the end."""
    if jobs <= 1:
        from workbench.report.runner import start_kernel

        outcomes = []
        own = kernel is None
        kernel = start_kernel(only=args.notebooks) if own else kernel
        try:
            for member in members:
                outcomes.append(diagnose_member(member, args, members_dir / member.name, kept_kernel=kernel))
                finished(outcomes[-1])
        finally:
            if own:
                kernel.close()
        return outcomes
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    by_name: dict[str, MemberOutcome] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_worker_kernel, initargs=(args.notebooks,)) as pool:
        futures = {pool.submit(_diagnose_in_worker, member, args, members_dir / member.name): member
                   for member in members}
        for future in as_completed(futures):
            member = futures[future]
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - the worker process died (killed, out of memory): exit 2
                outcome = MemberOutcome(member.name, str(member.path), None, USAGE_EXIT, {}, 0.0,
                                        f"its worker process died: {type(exc).__name__}: {exc}")
            by_name[outcome.name] = outcome
            finished(outcome)
    return [by_name[member.name] for member in members]


_WORKER_KERNEL = None  # in a worker process: the kernel its members share


def _start_worker_kernel(notebooks: list[str] | None) -> None:
    """A worker process' kernel, started as the worker starts and shut down as it exits (multiprocessing runs its
    finalizers on a worker's normal exit; a worker killed outright takes its kernel with it: ipykernel exits when
    its parent process is gone, and a kernel forked by a kernel server goes with its client)."""
    global _WORKER_KERNEL
    from multiprocessing import util

    from workbench.report.runner import start_kernel

    prepare_worker_process()
    try:
        _WORKER_KERNEL = start_kernel(only=notebooks)
    except Exception:  # noqa: BLE001 - a pool whose initializer raises is broken for every member: each member
        return         # starts its own kernel instead, and says so itself if that fails too
    util.Finalize(_WORKER_KERNEL, _WORKER_KERNEL.close, exitpriority=10)


def series_kernel(args: argparse.Namespace):
    """The kernel the members of a local sweep run in one after another (`--jobs 1`), started now, for the caller to
    hand to `run_local` and then to the sweep's page, and to close; None for members side by side or on Ray."""
    if args.engine != "local" or args.jobs > 1:
        return None
    from workbench.report.runner import start_kernel

    return start_kernel(only=args.notebooks)


def prepare_worker_process() -> None:
    """What the CLI's own process does before it imports papermill, done in a spawned worker too (a fresh
    interpreter inherits the environment, not the parent's `sys.modules`): without it each worker's `import papermill`
    compiles rfc3987_syntax's grammars, 1.7–3 s of CPU per worker (`runtime.skip_slow_optional_imports`)."""
    from workbench.runtime import skip_slow_optional_imports

    skip_slow_optional_imports()


def _diagnose_in_worker(member: Member, args: argparse.Namespace, into: Path) -> MemberOutcome:
    return diagnose_member(member, args, into, kept_kernel=_WORKER_KERNEL)
