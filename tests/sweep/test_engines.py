"""A sweep of three real runs (healthy, NaN adapter, a tokenizer saved with another pad) on the local engine and on
a real local Ray cluster started by the test on 127.0.0.1 for the Ray sweep and stopped once it is done: each bad run
named by its own check, the same verdicts on both engines, and a Ray worker killed mid-sweep whose member is still
reported, the lost attempt in its cost block. Members are diagnosed with notebook 00 only (`--notebooks 00`): it
answers both faults, and every member still goes through `diagnose`'s path."""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import run_sweep
from repo import quick_python_path

pytestmark = pytest.mark.slow

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0",
           # the test's cluster listens on loopback only, for this session: no token to share with the CLI's process
           "RAY_AUTH_MODE": "disabled",
           # Ray runs its workers at nice 15 (its worker_niceness setting, "Adjusted worker niceness to 15" in each
           # worker's log), so that on a machine of its own the raylet stays responsive; here the other test worker's
           # processes run at nice 0 beside it and starved the members' diagnoses (the sweep took 100-180 s instead
           # of 25 s under 3 busy processes). Ray's own job manager sets 0 the same way (ray 2.60
           # dashboard/modules/job/job_manager.py)
           "RAY_worker_niceness": "0",
           # no Python worker started before a task asks for one: the raylet prestarts one per CPU for the first
           # driver (ray_head.py's own, which runs no task) and the sweep's job starts its own anyway, with the
           # job's runtime_env (ray 2.60 ray_config_def.h: enable_worker_prestart, prestart_worker_first_driver).
           # Those two idle workers were 2.8 s of CPU of the cluster's start (12.5 s) on this project's machine
           "RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
START_TRIES = 3  # on a loaded 2-core machine Ray's raylet sometimes misses its own 30 s start-up deadline
CRASH_ONCE = Path(__file__).with_name("crash_once")
CRASHED_MEMBER = "healthy"  # the first of three_runs


@contextlib.contextmanager
def local_ray_cluster():
    """A local Ray cluster on 127.0.0.1 with two CPUs, held by a helper process (tests/sweep/ray_head.py) and its
    files in a temporary folder of its own, for as long as the block runs (the sweep that needs it): stopped by
    closing the helper's input, then by the ids of whatever that folder's session left (never `ray stop`, which
    stops every Ray on the machine). Its seven processes burn about 0.03 of a core while idle (the log monitor's
    polling, the raylet's and GCS's heartbeats): kept for the rest of the session, that was some 6 s of CPU. Its
    processes import tests/quick_site's sitecustomize, and so do its workers (`ray_sweep`)."""
    pytest.importorskip("ray")
    errors = []
    for _ in range(START_TRIES):
        temp = Path(tempfile.mkdtemp(prefix="wbray"))  # short: Ray's socket paths live under it
        with (temp / "head.log").open("w") as log:  # a file, not a pipe nobody reads while the cluster runs
            head = subprocess.Popen([sys.executable, str(Path(__file__).with_name("ray_head.py")), str(temp)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                    env={**os.environ, **RAY_ENV, "PYTHONPATH": quick_python_path()})
        # the helper prints its address once the cluster is up, or exits
        line = next((out for out in head.stdout if out.startswith("ADDRESS ")), "")
        if line:
            break
        head.wait()
        errors.append(((temp / "head.log").read_text().strip().splitlines() or ["exited"])[-1])
        _stop(head, temp)
    else:
        pytest.skip(f"a local Ray cluster did not start on this machine in {START_TRIES} tries: {errors[-1]}")
    try:
        yield "127.0.0.1:" + line.split()[1].rpartition(":")[2]
    finally:
        _stop(head, temp)


def _stop(head: subprocess.Popen, temp: Path) -> None:
    if head.poll() is None:
        head.stdin.close()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()
    for process in _cluster_processes(temp):
        process.kill()
    shutil.rmtree(temp, ignore_errors=True)


def _cluster_processes(temp: Path):
    """The processes of the cluster whose files are under `temp`, with their children (workers, kernels)."""
    import psutil

    found = {}
    for process in psutil.process_iter(["cmdline"]):
        if str(temp) in " ".join(process.info["cmdline"] or []):
            found[process.pid] = process
            for child in process.children(recursive=True):
                found[child.pid] = child
    return list(found.values())


@pytest.fixture(scope="session")
def ray_sweep(three_runs, tmp_path_factory):
    """The sweep on Ray, the worker of the healthy member's first task killed once as the task starts
    (tests/sweep/crash_once: a sitecustomize the sweep's worker environment carries into the Ray workers). The healthy
    member is the one the local engine runs first, in its fresh kernel: whichever worker survives the crash starts
    its kernel for another member, one the local engine ran in its kept kernel."""
    reports = tmp_path_factory.mktemp("ray-sweep")
    crash = {"PYTHONPATH": os.pathsep.join([str(CRASH_ONCE), quick_python_path()]),
             "WORKBENCH_CRASH_ONCE": str(reports / "crashed-once"), "WORKBENCH_CRASH_MEMBER": CRASHED_MEMBER}
    with local_ray_cluster() as address:
        sweep = run_sweep([*three_runs, "--notebooks", "00", "--engine", "ray", "--address", address], reports,
                          env={**RAY_ENV, **crash})
    assert (reports / "crashed-once").exists(), "no Ray worker started a member: the planted crash never ran"
    return sweep


def test_each_bad_run_of_a_sweep_is_named_by_its_own_check(local_sweep):
    assert local_sweep.result.returncode == 1, local_sweep.result.stderr[-3000:]
    assert local_sweep.failing() == {"healthy": [], "nan": ["adapter.weights"], "other_pad": ["tokenizer.vocab"]}
    assert local_sweep.document["first_bad"] == {}  # runs side by side have no order
    assert [m["exit_code"] for m in local_sweep.document["members"]] == [0, 1, 1]
    assert set(local_sweep.document) == {"engine", "members", "first_bad"}
    assert set(local_sweep.document["members"][0]) == {"name", "path", "report", "exit_code", "verdicts"}


def test_ray_gives_the_local_engines_verdicts(local_sweep, ray_sweep):
    assert ray_sweep.result.returncode == 1, ray_sweep.result.stderr[-3000:]
    assert ray_sweep.document["engine"] == "ray"
    assert ray_sweep.verdicts() == local_sweep.verdicts()
    for member in ray_sweep.document["members"]:  # each report gathered back into the sweep's folder
        assert (ray_sweep.folder / member["report"] / "00_saved_files.html").is_file()


def test_members_in_series_share_one_kernel_and_report_what_a_kernel_of_their_own_reports(local_sweep, ray_sweep):
    """The local engine in series keeps one kernel for its members (reset between them); each Ray worker keeps one
    for the members it runs in turn (a worker's first member starts it). A member the local engine ran in its kept
    kernel runs in a fresh one on Ray (the crash is planted on the member it ran first: `ray_sweep`). Finding for
    finding the same reports, and each cost block says which kernel it ran in."""
    def findings(sweep, name):
        return sorted((f["id"], f["verdict"], f["title"], f["detail"]) for f in sweep.member_report(name)["findings"])

    def kernels(sweep, name):
        cost = sweep.member_report(name)["cost"]
        return cost["kernels_started"], cost["kernel_kept"]

    names = [m["name"] for m in local_sweep.document["members"]]
    assert names[0] == CRASHED_MEMBER, names
    for name in names:
        assert findings(local_sweep, name) == findings(ray_sweep, name), name
    assert [kernels(local_sweep, n) for n in names] == [(1, False), (0, True), (0, True)]
    # Ray: one kernel started per worker process that ran members, the rest kept
    ray_kernels = {n: kernels(ray_sweep, n) for n in names}
    workers = {ray_sweep.member_report(n)["cost"]["sweep"]["host"] for n in names}
    restarted = _kernel_logs(ray_sweep, [n for n, (started, _) in ray_kernels.items() if started > 1])
    assert set(ray_kernels.values()) <= {(1, False), (0, True)}, (ray_kernels, restarted)
    assert sum(started for started, _ in ray_kernels.values()) == len(workers), (ray_kernels, workers, restarted)
    # how many workers ran members is Ray's timing (a survivor may run every member in turn); whichever ran first
    # in a surviving worker is a member the local engine kept: the kept kernel held to a fresh one
    assert any(kernels(local_sweep, n) == (0, True) and ray_kernels[n] == (1, False) for n in names), ray_kernels
    index = (local_sweep.folder / "members" / names[1] / "index.html").read_text()
    assert "the kernel of the previous diagnosis, kept and reset" in index


def _kernel_logs(sweep, names: list[str]) -> dict[str, str]:
    """The end of each named member's kernel.log (every kernel its diagnosis started wrote there: why one ended) and
    of this worker's kernel server's log (what it forked and refused): the evidence when a member started a second
    kernel, which no member here should."""
    from tests.served_kernels import running

    member = {m["name"]: m for m in sweep.document["members"]}
    logs = {n: (sweep.folder / member[n]["report"] / "kernel.log").read_text(errors="replace")[-1500:] for n in names}
    server = running()
    if names and server is not None and server.log.exists():
        logs["kernel server"] = server.log.read_text(errors="replace")[-1500:]
    return logs


def test_a_worker_killed_mid_sweep_is_retried_and_its_member_reported(ray_sweep):
    costs = {m["name"]: ray_sweep.member_report(m["name"])["cost"]["sweep"] for m in ray_sweep.document["members"]}
    retried = [name for name, cost in costs.items() if cost["attempts"] == 2]
    assert retried == [CRASHED_MEMBER], costs
    [lost] = costs[retried[0]]["lost_attempts"]
    assert "WorkerCrashedError" in lost["lost"], lost
    assert all(m["report"] for m in ray_sweep.document["members"])
    assert "attempt 2 of 3" in ray_sweep.result.stdout


def test_the_page_runs_in_the_members_kernel_once_their_names_are_given_back(local_sweep, tmp_path):
    """The sweep's page, run in the kernel its members ran in one after another (`write_comparison(kernel=...)`),
    is the page a kernel of its own writes, and that kernel is the same process afterwards, a member's names gone
    from its namespace (`Kernel.release_the_model`)."""
    import re

    from workbench.catalog import SWEEP_NOTEBOOK
    from workbench.report.runner import start_kernel
    from workbench.sweep.page import write_comparison

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(local_sweep.folder, folder, ignore=shutil.ignore_patterns("index.html", f"{SWEEP_NOTEBOOK}.*"))
        return folder

    def page(folder):
        html = (folder / "index.html").read_text()
        return re.sub(r'id="cell-id=[0-9a-f-]+"', "", html.replace(str(folder), "SWEEP"))

    def ask(kernel, expression):
        reply = kernel._run_quietly("", 60, expressions={"x": expression})
        return reply["user_expressions"]["x"]["data"]["text/plain"]

    own, kept = copy("own"), copy("kept")
    assert write_comparison(own, history=False, cell_timeout=300) is None
    kernel = start_kernel(only=["00_saved_files"])
    try:
        kernel._run_quietly("left_by_a_member = 1", 60)
        pid = ask(kernel, "__import__('os').getpid()")
        assert write_comparison(kept, history=False, cell_timeout=300, kernel=kernel) is None
        assert ask(kernel, "__import__('os').getpid()") == pid
        assert ask(kernel, "'left_by_a_member' in globals()") == "False"
    finally:
        kernel.close()
    assert page(kept) == page(own)
