"""The local engine: the members on this machine, one after another, or `jobs` at a time in worker processes
(spawned: a fresh interpreter each, so no state of one diagnosis reaches another's).

One after another, the members share one kernel: the stack's imports (torch, transformers, peft: about 5 s of CPU
on 2 cores) are paid once, not per member, and between two members the kernel is made as a fresh one would be
(`workbench.report.kernel_reset`: the shared model, the record of loads, the user's set-up module, the random
generators, the peak memory). A member whose notebook kills the kernel leaves the next member a fresh one."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from workbench.sweep.member_run import USAGE_EXIT, MemberOutcome, diagnose_member
from workbench.sweep.members import Member


def run_local(members: list[Member], args: argparse.Namespace, members_dir: Path, *, jobs: int,
              finished: Callable[[MemberOutcome], None]) -> list[MemberOutcome]:
    """Each member's outcome, in member order; `finished(outcome)` as each one ends."""
    if jobs <= 1:
        from workbench.report.runner import start_kernel

        outcomes = []
        kernel = start_kernel(only=args.notebooks)
        try:
            for member in members:
                outcomes.append(diagnose_member(member, args, members_dir / member.name, kept_kernel=kernel))
                finished(outcomes[-1])
        finally:
            kernel.close()
        return outcomes
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    by_name: dict[str, MemberOutcome] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(diagnose_member, member, args, members_dir / member.name): member
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
