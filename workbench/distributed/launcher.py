"""Launching a module under torchrun: N local ranks, a free loopback port, a timeout, and nothing left behind.

    run = launch_ranks("workbench.distributed.rank", ["--spec", "spec.json", "--out", out], ranks=2,
                       timeout=300, out_dir=out)
    run.results          # {rank: the JSON that rank wrote to out/rank<N>.json}
    run.timed_out, run.returncode, run.output_tail

Each launch takes its own free port on 127.0.0.1, so two diagnoses at once do not meet in one rendezvous. gloo on
the CPU; nccl where there is a GPU per rank. torchrun runs in a session of its own, and torch.distributed.elastic
starts every rank in a session of its own too: killing torchrun's process group alone would leave the ranks
running, so on timeout the launcher signals torchrun's group and each rank's group (SIGTERM, then SIGKILL after a
grace period), DataLoader workers included. On the rank side, `RankLog` writes what `read_results` reads, and a
watchdog ends a rank whose launcher is gone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from workbench.errors import NotApplicable
from workbench.paths import PROJECT_ROOT as PACKAGE_ROOT  # the folder holding the workbench package

GRACE_SECONDS = 5.0
TAIL_CHARS = 6000


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now: the OS picks it for a socket bound to port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def backend_for(ranks: int) -> str:
    """nccl when every rank can have a GPU of its own, else gloo (CPU tensors)."""
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks else "gloo"


def torchrun_command(module: str, args: list[str], ranks: int, port: int, log_dir: str | Path) -> list[str]:
    """torchrun running `python -m module args` on each rank; where a kernel server runs
    (`workbench.report.kernel_server`), each rank is forked from it by its client, the stack already imported.
    `log_dir`: torch elastic's log folder (`--log-dir`), inside the launch's own folder: without it torch makes a
    `torchelastic_*` folder in the system's temporary folder at every launch and leaves it there (torch 2.13
    distributed/elastic/multiprocessing/api.py `DefaultLogsSpecs`: `tempfile.mkdtemp(prefix="torchelastic_")`)."""
    from workbench.report.kernel_client import served_module

    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", uuid.uuid4().hex[:12],
            "--max-restarts", "0", "--monitor-interval", "0.5", "--log-dir", str(log_dir),
            "-m", *served_module(module, args)]


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment, one CPU thread per rank, and the workbench plus the current folder importable
    (a user's `--setup my_recipe:load` resolves from there, as in the parent)."""
    path = [str(PACKAGE_ROOT), os.getcwd(), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in path if p), **(extra or {})}


@dataclasses.dataclass
class RankRun:
    """What a torchrun launch left: exit status, whether it timed out, each rank's result file, the output tail."""

    command: list[str]
    ranks: int
    timeout: float
    returncode: int | None
    timed_out: bool
    seconds: float
    results: dict[int, dict[str, Any]]
    output_tail: str
    pids: list[int]  # torchrun and every rank seen: none of them may outlive the launch
    killed: list[int]  # the processes the launcher had to signal

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def as_evidence(self) -> dict[str, Any]:
        return {"command": " ".join(self.command), "ranks": self.ranks, "timeout_s": self.timeout,
                "returncode": self.returncode, "timed_out": self.timed_out, "seconds": round(self.seconds, 1),
                "pids": self.pids, "killed": self.killed, "output_tail": self.output_tail[-3000:]}


def _descendants(pid: int) -> dict[int, Any]:
    """pid -> psutil.Process for every process below `pid` (a Process remembers its start time, so a pid the
    system later reuses for another program is never mistaken for one of ours)."""
    import psutil

    try:
        return {child.pid: child for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return {}


def _alive(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_groups(processes: list, sig: int) -> None:
    """Signal each live process's group (torchrun's, and each rank's own session), then the process itself."""
    for process in processes:
        if not _alive(process):
            continue
        try:
            group = os.getpgid(process.pid)
            if group != os.getpgrp():  # never our own group (the notebook kernel's)
                os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.send_signal(sig)
        except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: it is gone, which is the point
            pass


def terminate_tree(proc: subprocess.Popen, known: dict[int, Any], grace: float = GRACE_SECONDS) -> list[int]:
    """SIGTERM torchrun and every process below it (each in its own group), SIGKILL what is left after `grace`
    seconds. `known` holds processes seen below torchrun earlier. Returns the pids signalled."""
    import psutil

    try:
        processes = {proc.pid: psutil.Process(proc.pid), **known, **_descendants(proc.pid)}
    except psutil.Error:
        processes = {**known, **_descendants(proc.pid)}
    _signal_groups(list(processes.values()), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in processes.values()):
        try:
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        processes.update({k: v for k, v in _descendants(proc.pid).items() if k not in processes})
    _signal_groups([p for p in processes.values() if _alive(p)], signal.SIGKILL)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    return sorted(processes)


# ----- the rank side: its result file, and a watchdog -----

class RankLog:
    """This rank's result file, rewritten whole after every change."""

    def __init__(self, out: Path, rank: int, world_size: int) -> None:
        self.path = out / f"rank{rank}.json"
        self.data: dict[str, Any] = {"rank": rank, "world_size": world_size, "pid": os.getpid(),
                                     "host": os.uname().nodename, "stage": "starting", "stages": {},
                                     "sections": {}, "error": None, "started_at": time.time()}
        self._started = time.monotonic()
        self.save()

    def stage(self, name: str) -> None:
        self.data["stage"] = name
        self.data["stages"][name] = round(time.monotonic() - self._started, 2)  # seconds since the rank started
        self.save()

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.save()

    def section(self, name: str, value: dict[str, Any]) -> None:
        self.data["sections"][name] = value
        self.save()

    def fail(self, exc: BaseException) -> None:
        self.data["error"] = {"stage": self.data["stage"], "type": type(exc).__name__, "message": str(exc)[:2000],
                              "traceback": "".join(traceback.format_exception(exc))[-8000:], "at": time.time(),
                              # a set-up for another kind of model (workbench.errors.NotApplicable): a skip, not a crash
                              "not_applicable": getattr(exc, "title", None) if isinstance(exc, NotApplicable) else None}
        self.save()

    def save(self) -> None:
        from workbench.findings import write_json_atomic

        write_json_atomic(self.path, self.data)


def start_watchdog(launcher_pid: int | None, seconds: float) -> None:
    """End this rank when the launcher is gone (a notebook kernel killed mid-run cannot stop torchrun, which runs in
    a session of its own) or when `seconds` have passed: no rank outlives the diagnosis that started it."""
    import threading

    def launcher_alive() -> bool:
        try:
            os.kill(launcher_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def watch() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (launcher_pid is None or launcher_alive()):
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, name="workbench-watchdog", daemon=True).start()


def read_results(out_dir: Path) -> dict[int, dict[str, Any]]:
    """rank<N>.json files, as each rank last wrote them (a half-written file is never seen: ranks write then
    rename)."""
    results = {}
    for path in sorted(out_dir.glob("rank*.json")):
        try:
            results[int(path.stem.removeprefix("rank"))] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return results


def _tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def launch_ranks(module: str, args: list[str], *, ranks: int, timeout: float, out_dir: str | Path,
                 env: dict[str, str] | None = None) -> RankRun:
    """Run `python -m module args` on `ranks` local ranks under torchrun; wait at most `timeout` seconds."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # a port taken between free_port() and torchrun's bind: once more, on another port
        run = _launch_once(module, args, ranks=ranks, timeout=timeout, out_dir=out_dir, env=env)
        if run.ok or run.results or "Address already in use" not in run.output_tail:
            return run
    return run


def _launch_once(module: str, args: list[str], *, ranks: int, timeout: float, out_dir: Path,
                 env: dict[str, str] | None) -> RankRun:
    command = torchrun_command(module, args, ranks, free_port(), out_dir / "torchelastic")
    log = out_dir / "torchrun.log"
    start = time.monotonic()
    killed: list[int] = []
    seen: dict[int, Any] = {}
    with open(log, "w") as output:
        proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=rank_environment(env), start_new_session=True)
        timed_out = False
        try:
            while proc.poll() is None:  # poll rather than wait(timeout): note each rank while it lives
                seen.update({k: v for k, v in _descendants(proc.pid).items() if k not in seen})
                if time.monotonic() - start > timeout:
                    timed_out = True
                    break
                try:  # back at once when torchrun exits, else in a quarter of a second to note new ranks
                    proc.wait(timeout=0.25)
                except subprocess.TimeoutExpired:
                    pass
        finally:  # a timeout, or the caller interrupted: nothing of ours stays behind
            if proc.poll() is None or any(_alive(p) for p in seen.values()):
                killed = terminate_tree(proc, seen)
    stray = [p for p in seen.values() if _alive(p)]  # a rank that outlived torchrun: its own group, by its pid
    if stray:
        _signal_groups(stray, signal.SIGKILL)
        killed += [p.pid for p in stray]
    return RankRun(command, ranks, timeout, proc.returncode, timed_out, time.monotonic() - start,
                   read_results(out_dir), _tail(log), sorted({proc.pid, *seen}), sorted(set(killed)))


def rank_main(description: str, run, argv: list[str] | None = None, default_timeout: float = 600) -> int:
    """A rank module's `main` under torchrun: `--spec SPEC --out DIR`, the rank's result file, a watchdog on the
    launcher, `run(spec, log)`, an exception written with its traceback (exit 1), the process group closed."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, help="JSON: target arguments, what to run, timeout")
    parser.add_argument("--out", required=True, help="folder for rank<N>.json")
    args = parser.parse_args(argv)
    log = RankLog(Path(args.out), int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    code = 0
    try:
        spec = json.loads(Path(args.spec).read_text())
        start_watchdog(spec.get("launcher_pid"), float(spec.get("timeout", default_timeout)) + 30)
        run(spec, log)
        log.stage("done")
    except Exception as exc:  # noqa: BLE001 - written with its traceback for the parent to report
        log.fail(exc)
        traceback.print_exc()
        code = 1
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and code == 0:
            dist.destroy_process_group()
    return code
