"""The Ray engine: one Ray task per member, on an existing cluster (`--address HOST:PORT`) or a local one that Ray
starts. Ray is imported here only, when `--engine ray` asks for it.

- Each task asks for what its member needs (`needs.member_needs`: a CPU, a whole GPU when the cluster has GPUs and
  the set-up loads on CUDA, memory from the checkpoint's headers): Ray never places two `num_gpus=1` tasks on one GPU.
- Reports come back through Ray's object store (the task packs its report folder; this process unpacks it into the
  sweep's folder), or, with `--shared-dir`, through a folder every node sees (the task writes there; this process
  moves the report in).
- A worker lost mid-task (killed, its node gone) is retried here, up to `MAX_ATTEMPTS` in all, not by Ray's silent
  retry (`max_retries=0`): each lost attempt is recorded in the member's cost block.
- Progress: one line per member as it finishes, in whatever order the cluster finishes them.
- Each Ray worker keeps one kernel for the members given no GPU that it runs in turn (`_worker_kernel`), reset between
  them as the local engine's is.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import socket
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from workbench.errors import UsageError
from workbench.sweep.member_run import USAGE_EXIT, MemberOutcome, diagnose_member
from workbench.sweep.members import Member
from workbench.sweep.needs import member_needs

MAX_ATTEMPTS = 3
TASK_NAME = "diagnose_sweep_member"  # the worker's process title while it runs a member: `ray::diagnose_sweep_member`
INSTALL_FIX = "pip install 'finetune-workbench[ray]' (or `make install`)"
# the environment a member's task needs from this process: the workbench's own settings and the hub's offline mode
FORWARDED_ENV = ("WORKBENCH_", "HF_", "TRANSFORMERS_", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(f"--engine ray: Ray is not installed; {INSTALL_FIX}") from None
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse an address nothing listens on before Ray spends a minute retrying it (exit 2, one line)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address}: use HOST:PORT (the head node's GCS address, 6379 by default)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UsageError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); start one "
                         "with `ray start --head`, or leave --address out for a local one") from None


def worker_environment() -> dict[str, str]:
    """Environment variables for every task: this checkout importable (a clone run without installing), and the
    workbench's and the hub's settings of this process."""
    from workbench.sweep.page import pythonpath_with_checkout

    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
    env["PYTHONPATH"] = pythonpath_with_checkout()
    return env


def connect(ray, address: str | None) -> None:
    if address:
        check_reachable(address)
    try:
        ray.init(address=address, runtime_env={"env_vars": worker_environment()}, log_to_driver=False,
                 include_dashboard=False if not address else None)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise UsageError(f"--engine ray: cannot join {where} ({str(exc).splitlines()[0][:200]}); check "
                         "`ray status`" + (" on that cluster" if address else "")) from None


def largest_node_memory(ray) -> int:
    return max((int(n["Resources"].get("memory", 0)) for n in ray.nodes() if n.get("Alive")), default=0)


def run_on_ray(members: list[Member], args: argparse.Namespace, members_dir: Path, *, address: str | None,
               shared_dir: Path | None, finished: Callable[[MemberOutcome], None]) -> list[MemberOutcome]:
    """Each member's outcome, in member order; `finished(outcome)` as each one ends."""
    ray = import_ray()
    connect(ray, address)
    try:
        return _run(ray, members, args, members_dir, shared_dir, finished)
    finally:
        ray.shutdown()  # leaves a cluster we joined running; stops the one ray.init started


def _run(ray, members, args, members_dir, shared_dir, finished) -> list[MemberOutcome]:
    gpus = float(ray.cluster_resources().get("GPU", 0))
    needs = {m.name: member_needs(m.path, cluster_gpus=gpus, device_map=args.device_map) for m in members}
    biggest = largest_node_memory(ray)
    for member in members:
        if needs[member.name].memory_bytes > biggest:
            raise UsageError(f"{member.name} needs about {needs[member.name].memory_bytes / 1e9:.1f} GB of memory "
                             f"and the largest node of the Ray cluster offers {biggest / 1e9:.1f} GB; add a larger "
                             "node, or diagnose it with --engine local on a machine that holds it")
    sweep_id = uuid.uuid4().hex[:12]
    remote = ray.remote(_member_task)
    lost_errors = _lost_worker_errors(ray)

    def submit(member: Member):
        options = {**needs[member.name].as_ray_options(), "name": TASK_NAME, "max_retries": 0}
        landing = str(shared_dir / sweep_id / member.name) if shared_dir else None
        return remote.options(**options).remote(member, args, landing)

    pending = {submit(m): (m, []) for m in members}
    outcomes: dict[str, MemberOutcome] = {}
    while pending:
        [ready], _ = ray.wait(list(pending), num_returns=1)
        member, lost = pending.pop(ready)
        try:
            outcome, packed = ray.get(ready)
        except lost_errors as exc:
            lost = lost + [{"attempt": len(lost) + 1, "lost": f"{type(exc).__name__}: {_first_line(exc)}"}]
            if len(lost) < MAX_ATTEMPTS:
                print(f"[{member.name}] its worker was lost ({type(exc).__name__}); attempt {len(lost) + 1} of "
                      f"{MAX_ATTEMPTS}", flush=True)
                pending[submit(member)] = (member, lost)
                continue
            outcome, packed = _given_up(member, lost), None
        except Exception as exc:  # noqa: BLE001 - the task raised: the member has no report, the others go on
            outcome, packed = MemberOutcome(member.name, str(member.path), None, USAGE_EXIT, {}, 0.0,
                                            f"its Ray task failed: {type(exc).__name__}: {_first_line(exc)}"), None
        outcome.attempts = lost
        outcome.report = _gather(outcome, packed, members_dir / member.name)
        outcomes[member.name] = outcome
        finished(outcome)
    return [outcomes[m.name] for m in members]


def _member_task(member: Member, args: argparse.Namespace, landing: str | None):
    """On a worker: the member diagnosed; its report packed for the object store, or left at `landing`."""
    kernel = _worker_kernel(args.notebooks)
    try:
        if landing is not None:
            into = Path(landing)
            shutil.rmtree(into, ignore_errors=True)  # what a lost earlier attempt left
            return diagnose_member(member, args, into, kept_kernel=kernel), None
        with tempfile.TemporaryDirectory(prefix="workbench-sweep-") as scratch:
            outcome = diagnose_member(member, args, Path(scratch) / member.name, kept_kernel=kernel)
            return outcome, _pack(Path(outcome.report)) if outcome.report else None
    finally:
        if kernel is not None:
            kernel.release_the_model()  # Ray gives the task's memory to others as it ends


# On a Ray worker: the kernel the members it runs share. Ray reuses a worker process for the job's next task, so its
# members pay the stack's imports once, as the local engine's do, and `Kernel.begin_diagnosis` resets the kernel
# between them; as each task ends the kernel gives its member's model and memory back, since Ray hands the task's
# memory to other tasks while the worker waits. Only for tasks given no GPU: Ray recycles the workers of GPU tasks
# here too (their GPUs come from `.options()`, so `max_calls=1` is not applied: ray/remote_function.py, issue 29624),
# and an idle kernel's CUDA context would keep a GPU that Ray has given to another task; a GPU task's member starts
# a kernel of its own, closed when it ends. A worker that Ray stops takes its kernel with it: ipykernel exits when
# its parent process is gone (a kernel forked by a kernel server: its client exits, and the server kills it).
_WORKER_KERNEL = None


def _worker_kernel(notebooks: list[str] | None):
    """This worker's kept kernel, started by its first member; None for a task given GPUs, or where no kernel can
    start (the member then starts one of its own, and says so itself if that fails too)."""
    global _WORKER_KERNEL
    import atexit

    from workbench.report.runner import start_kernel

    if import_ray().get_gpu_ids():  # the GPUs Ray gave this task
        return None
    if _WORKER_KERNEL is None:
        try:
            _WORKER_KERNEL = start_kernel(only=notebooks)
        except Exception:  # noqa: BLE001 - the member starts its own kernel
            return None
        atexit.register(_close_worker_kernel)
    return _WORKER_KERNEL


def _close_worker_kernel() -> None:
    if _WORKER_KERNEL is not None:
        _WORKER_KERNEL.close()


def _pack(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def _gather(outcome: MemberOutcome, packed: bytes | None, into: Path) -> str | None:
    """The member's report into the sweep's folder: unpacked from the object store, or moved from the shared path."""
    if outcome.report is None:
        return None
    if packed is not None:
        into.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            tar.extractall(into, filter="data")
    else:
        shutil.move(outcome.report, into)
    return str(into)


def _given_up(member: Member, lost: list[dict]) -> MemberOutcome:
    return MemberOutcome(member.name, str(member.path), None, USAGE_EXIT, {}, 0.0,
                         f"its worker was lost {len(lost)} times: {lost[-1]['lost']}")


def _lost_worker_errors(ray) -> tuple[type[BaseException], ...]:
    """Ray's errors for a task whose worker or node went away (not an error the task raised)."""
    names = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]

