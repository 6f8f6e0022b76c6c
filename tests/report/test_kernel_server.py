"""Kernels forked from a kernel server (`workbench.report.kernel_server`): the kernel a forked child becomes is the
one `ipykernel_launcher` starts, in the requester's folder, PYTHONPATH and streams, with the stack imported; the
signals jupyter sends reach it; killing its client leaves no kernel behind; an environment the server cannot honour
gets a kernel started as usual."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from workbench.report.kernel_server import RUN_TIME_VARIABLES, SERVER_ENV, refusal

LOGGED = "from transformers.utils import logging as l\nl.get_logger('transformers').error('said-by-transformers')"


@pytest.fixture(scope="module")
def module_kernel_server(tmp_path_factory):
    """A server in the environment the test workers give their kernels and ranks, ready (its socket bound once its
    imports are done): this worker's own (tests/served_kernels.py) where it serves this environment, else (a session
    run without one, WORKBENCH_TEST_KERNEL_SERVER=0, or an environment an earlier test changed) one of this
    module's."""
    from tests import served_kernels
    from workbench.distributed.launcher import rank_environment

    served = served_kernels.running()
    # the kernels' environment, and the one torchrun's ranks get (one thread each, which a session in one process,
    # TEST_WORKERS=0, does not set for its server)
    if served is not None and all(served_kernels.would_fork(env) for env in (dict(os.environ), rank_environment())):
        _wait_for_the_socket(served, served.socket)
        yield served
        return
    from workbench.runtime import quiet_and_offline

    folder = tmp_path_factory.mktemp("server")
    path, log = str(folder / "k.sock"), folder / "server.log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SERVER_ENV, path)
        patch.setenv("OMP_NUM_THREADS", "1")  # as the workers and the ranks they launch have them
        patch.setenv("MKL_NUM_THREADS", "1")
        quiet_and_offline()  # as the server sets them: the environment it serves is this one
        with open(log, "wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "workbench.report.kernel_server", path],
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        process.log = log
        _wait_for_the_socket(process, path)
        yield process
        process.terminate()
        process.wait(timeout=30)
    assert not os.path.exists(path)


def _wait_for_the_socket(process, path):
    from tests import served_kernels

    served_kernels.wait_for_socket(process, path)
    assert os.stat(path).st_mode & 0o777 == 0o600  # only its own user may ask it to run code


def test_a_server_serves_on_a_socket_of_its_own_user_and_removes_it_when_terminated(tmp_path):
    """The listening loop alone (no imports: `serve` without `prepare`): its socket made 0600, gone after SIGTERM."""
    path = str(tmp_path / "k.sock")
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-c", "import sys\nfrom workbench.report.kernel_server import "
                                   "KernelServer\nKernelServer(sys.argv[1]).serve()", path],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    server.log = log
    try:
        _wait_for_the_socket(server, path)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, log.read_text()
    assert not os.path.exists(path)


def _server_whose_launcher_is_killed(server_code: str, arguments: list[str], started, why: str):
    """A launcher process that starts `python -c server_code ARGUMENTS` and waits; once `started()` (a callable) is
    true, the launcher is killed outright: the server process, left reparented. Then the server is waited for to
    stop (30 s), killed if it has not (none is left behind), and `why` is the failure."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {server_code!r}, "
         "*sys.argv[1:]], stdin=subprocess.DEVNULL)\ntime.sleep(600)", *arguments], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not started():
            assert launcher.poll() is None and time.monotonic() < deadline, "the server never started"
            time.sleep(0.05)
        (server,) = psutil.Process(launcher.pid).children()
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 30
    try:
        while _running(server):
            assert time.monotonic() < deadline, why
            time.sleep(0.05)
    finally:
        if _running(server):  # serving on with nobody to ask it: not left behind by the test
            server.kill()


def test_a_server_whose_launcher_is_killed_outright_stops_and_removes_its_socket(tmp_path):
    """A test worker or shell killed with SIGKILL sends no SIGTERM: the server (the listening loop alone), reparented,
    stops serving and removes its socket instead of holding the stack's memory with nobody left to ask it (the loop
    notices its new parent within a tick, 0.1 s)."""
    path = str(tmp_path / "k.sock")
    _server_whose_launcher_is_killed(
        "import sys\nfrom workbench.report.kernel_server import KernelServer\nKernelServer(sys.argv[1]).serve()",
        [path], lambda: os.path.exists(path), "the server outlived its launcher")
    assert not os.path.exists(path)


def test_a_launcher_killed_before_the_server_serves_still_stops_it(tmp_path):
    """The server takes its launcher as it starts, not once its socket is bound: a launcher killed in between (the
    test above kills it as soon as the socket appears; a loaded machine once let the server bind first and look at
    its parent after, so that it took init for its launcher and served on) is still seen gone, and the server stops
    and removes its socket. Here the launcher is killed after the server is made and before it serves, every time."""
    path = str(tmp_path / "k.sock")
    made = tmp_path / "made"
    _server_whose_launcher_is_killed(
        "import os, sys, time\nfrom workbench.report.kernel_server import KernelServer\n"
        "server = KernelServer(sys.argv[1])\nparent = os.getppid()\nopen(sys.argv[2], 'w').close()\n"
        "while os.getppid() == parent:\n    time.sleep(0.05)\nserver.serve()\nopen(sys.argv[2] + '.served', 'w').close()",
        [path, str(made)], made.exists, "the server outlived the launcher killed before it served")
    assert (tmp_path / "made.served").exists()  # it served, saw its launcher gone and returned
    assert not os.path.exists(path)


def _listening_loop(tmp_path, first: str = ""):
    """A server's listening loop alone (no imports), serving its own environment, `first` run before it: (the
    process, with `log` set on it; its socket's path; the environment it serves)."""
    path = str(tmp_path / "k.sock")
    env = {**os.environ, SERVER_ENV: path}
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-c", f"import os, sys\n{first}from workbench.report.kernel_server "
                                   "import KernelServer\nserver = KernelServer(sys.argv[1])\n"
                                   "server.base_env = dict(os.environ)\nserver.serve()", path],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    server.log = log
    return server, path, env


def test_a_stopped_server_removes_its_own_socket_file_and_no_other(tmp_path):
    """Stopping, a server removes the socket file it bound; where that file was removed and another put at its path
    (a second server's), it leaves that one and stops without an error."""
    from tests.served_kernels import wait_for_socket

    for replaced in (False, True):
        server, path, _env = _listening_loop(tmp_path)
        wait_for_socket(server, path)
        if replaced:
            os.unlink(path)
            open(path, "w").close()  # noqa: SIM115 - another file at the path
        server.terminate()
        assert server.wait(timeout=60) == 0, server.log.read_text()
        assert os.path.exists(path) == replaced, server.log.read_text()
        assert "Traceback" not in server.log.read_text(), server.log.read_text()
        if replaced:
            os.unlink(path)


def test_a_client_gone_before_its_answer_leaves_the_server_serving_and_no_process(tmp_path):
    """A client killed right after asking (jupyter_client stopping a kernel as it starts, a launcher killed outright)
    never reads its answer: the server (the listening loop, serving this environment) serves on — stopping, it took
    every kernel it had forked for the others with it — and the process forked for that client goes. The server is
    stopped while the requests queue, so that each client is gone before it is answered, whatever the timing."""
    import signal
    import socket

    from workbench.report.kernel_server import receive_message, send_message

    server, path, env = _listening_loop(tmp_path)
    log = server.log
    sleeper = {"module": "timeit", "argv": ["-n", "1", "-r", "1", "import time; time.sleep(600)"], "cwd": str(tmp_path)}

    def ask(environment):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        with open(os.devnull, "r+b") as null:  # the child's streams: not this worker's own
            try:
                send_message(sock, {**sleeper, "env": environment}, fds=[null.fileno()] * 3)
            except OSError as exc:
                raise AssertionError(f"{exc!r}; the server's log: {log.read_text()[-2000:]}") from exc
        return sock

    try:
        _wait_for_the_socket(server, path)
        os.kill(server.pid, signal.SIGSTOP)
        for environment in ({**env, "HF_HOME": str(tmp_path / "elsewhere")}, env):  # refused, then forked
            ask(environment).close()
        os.kill(server.pid, signal.SIGCONT)
        with ask(env) as sock:  # answered: the server still serves
            answer, _ = receive_message(sock)
            assert "pid" in answer, (answer, log.read_text())
            assert server.poll() is None, log.read_text()
        # its own client gone too, that child goes as well: none is left
        children = psutil.Process(server.pid).children()
        _, alive = psutil.wait_procs(children, timeout=30)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], log.read_text()
        assert "forked for a client that went before its answer" in log.read_text()
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, log.read_text()


def test_a_fork_that_fails_is_a_refusal_and_the_server_serves_on(tmp_path):
    """A fork the system refuses (no process or memory left) is answered as a refusal, with its reason, so that the
    client starts its process as usual; the server serves the next request."""
    import socket

    from workbench.report.kernel_server import receive_message, send_message

    server, path, env = _listening_loop(tmp_path, first="import errno\ndef fork():\n    raise OSError(errno.EAGAIN, "
                                        "'Resource temporarily unavailable')\nos.fork = fork\n")
    log = server.log
    try:
        _wait_for_the_socket(server, path)
        for _ in range(2):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, open(os.devnull, "r+b") as null:
                sock.connect(path)
                try:
                    send_message(sock, {"module": "json.tool", "argv": [], "env": env, "cwd": str(tmp_path)},
                                 fds=[null.fileno()] * 3)
                    answer, _ = receive_message(sock)
                except OSError as exc:
                    raise AssertionError(f"{exc!r}; the server ({server.poll()}): {log.read_text()[-2000:]}") from exc
            assert answer == {"refused": "the server could not fork ([Errno 11] Resource temporarily unavailable)"}, \
                (answer, log.read_text())
        assert server.poll() is None, log.read_text()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, log.read_text()


def _running(process) -> bool:
    """Neither gone nor a zombie (reparented, it is reaped by whoever adopted it, or not at all)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


SLEEPER = "import os, pathlib, time\npathlib.Path('pid').write_text(str(os.getpid()))\ntime.sleep(600)\n"
LAUNCHER = ("import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-m', 'workbench.report.kernel_client', "
            "'--module', 'sleeper'], stdin=subprocess.DEVNULL)\ntime.sleep(600)")


@pytest.mark.slow
def test_a_forked_process_goes_when_the_process_that_asked_for_it_is_killed(tmp_path, module_kernel_server):
    """A JupyterLab, Ray worker or torchrun killed outright: its client notices it was reparented (as ipykernel's
    parent poller does for a kernel started as usual) and exits, and the server kills the forked process."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=tmp_path, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert launcher.poll() is None
            time.sleep(0.1)
        forked = psutil.Process(int((tmp_path / "pid").read_text()))
        assert forked.ppid() == module_kernel_server.pid, module_kernel_server.log.read_text()[-2000:]
        [client] = psutil.Process(launcher.pid).children()
    finally:
        launcher.kill()
        launcher.wait()
    _, alive = psutil.wait_procs([forked, client], timeout=60)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    # the server's log says which process it stopped and why, and how it ended once reaped
    ended = f"kernel server: {forked.pid} ended (killed by SIGKILL)"
    deadline = time.monotonic() + 60
    while ended not in module_kernel_server.log.read_text():
        assert time.monotonic() < deadline, module_kernel_server.log.read_text()[-2000:]
        time.sleep(0.1)
    assert f"kernel server: stopped {forked.pid}, its client went" in module_kernel_server.log.read_text()


def test_a_client_whose_launcher_is_killed_before_its_answer_still_takes_its_process_with_it(tmp_path):
    """The client takes its launcher as it starts, not once the server has answered: a launcher killed while the
    client waits for its answer (here the server is stopped until then, every time) is still seen gone, the client
    exits and the server kills the process it forked, which would otherwise run on with nobody to stop it."""
    import signal

    server, path, env = _listening_loop(tmp_path)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    forked = None
    try:
        _wait_for_the_socket(server, path)
        os.kill(server.pid, signal.SIGSTOP)
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=tmp_path, stdin=subprocess.DEVNULL,
                                    env={**env, "PYTHONPATH": str(tmp_path)})
        try:
            deadline = time.monotonic() + 60
            # the client connected (its request waits in the stopped server's socket)
            while not (client := next(iter(psutil.Process(launcher.pid).children()), None)) or \
                    not client.net_connections(kind="unix"):
                assert launcher.poll() is None and time.monotonic() < deadline, "the client never connected"
                time.sleep(0.05)
        finally:
            launcher.kill()
            launcher.wait()
        os.kill(server.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.05)
        forked = psutil.Process(int((tmp_path / "pid").read_text()))
        deadline = time.monotonic() + 30
        while _running(client) or _running(forked):  # the client sees its launcher gone within its poll (1 s)
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()  # and with it whatever it forked
        server.wait(timeout=30)
        if forked is not None and _running(forked):
            forked.kill()


def started(tmp_path, env=None):
    from jupyter_client.manager import KernelManager

    from workbench.report.kernels import KERNEL_NAME, served_kernel_specs

    log = open(tmp_path / "kernel.log", "ab")  # noqa: SIM115 - closed with the test's folder
    km = KernelManager(kernel_name=KERNEL_NAME, **served_kernel_specs())
    km.start_kernel(stdout=log, stderr=log, cwd=str(tmp_path), env={**os.environ, **(env or {})})
    client = km.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return km, client


def run(client, code, timeout=60):
    out = []
    reply = client.execute_interactive(code, timeout=timeout,
                                       output_hook=lambda m: out.append(m["content"].get("text", "")))
    return reply["content"], "".join(out)


@pytest.mark.slow  # a server's imports, then kernels
def test_a_forked_kernel_is_the_kernel_ipykernel_starts_with_the_stack_imported(tmp_path, module_kernel_server):
    (tmp_path / "users_module.py").write_text("WHERE = 'the user folder'\n")
    km, client = started(tmp_path, {"PYTHONPATH": str(tmp_path), "WORKBENCH_BATCH": "1"})
    try:
        content, out = run(client, "import os, sys\nprint(os.getppid(), os.getcwd(), 'torch' in sys.modules, "
                                   "os.environ['WORKBENCH_BATCH'])\nimport users_module\nprint(users_module.WHERE)")
        assert content["status"] == "ok", content
        assert out.split() == [str(module_kernel_server.pid), str(tmp_path), "True", "1", "the", "user", "folder"], \
            module_kernel_server.log.read_text()
        # transformers' logger, made by the server's import, writes into the cell as in a kernel that imported it
        content, out = run(client, LOGGED)
        assert "said-by-transformers" in out
        # sys.path and argv[0] as the kernel ipykernel_launcher starts in the same folder and PYTHONPATH has them
        where = "import sys, json\nprint(json.dumps([sys.path, sys.argv[0]]))"
        forked = run(client, where)[1]
        fresh_km, fresh_client = started(tmp_path, {"PYTHONPATH": str(tmp_path), "WORKBENCH_BATCH": "1",
                                                    SERVER_ENV: ""})
        try:
            assert run(fresh_client, where)[1] == forked
        finally:
            fresh_client.stop_channels()
            fresh_km.shutdown_kernel(now=True)
        # an interrupt (jupyter's signal to the client's process group) reaches the kernel
        # stop_on_error=False: its KeyboardInterrupt must not have the kernel abort the requests sent after it
        # (ipykernel drops what arrives in its abort window after a failed request that asked to stop on error)
        # short sleeps in a loop: a SIGINT that does not land inside the sleep's system call (handled just before
        # it starts, on a loaded machine) does not end one long sleep(), and CPython raises it only when that sleep
        # ends (seen: 1 interrupt in 40 answered after 120 s under 3 busy processes); the loop raises it at its
        # next turn (0 in 80)
        sleeping = client.execute("import time\nprint('asleep', flush=True)\nfor _ in range(2400):\n"
                                  "    time.sleep(0.05)", stop_on_error=False)
        while "asleep" not in client.get_iopub_msg(timeout=30)["content"].get("text", ""):
            pass
        km.interrupt_kernel()
        reply = client.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != sleeping:
            reply = client.get_shell_msg(timeout=30)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        content, out = run(client, "print(os.getpid())")
        assert content["status"] == "ok", content
        kernel = int(out)
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)  # SIGKILL to the client: the server kills its kernel
    try:  # the kernel may exit between any two of these looks at it
        psutil.wait_procs([psutil.Process(kernel)], timeout=10)
        gone = psutil.Process(kernel).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    assert gone


@pytest.mark.slow
def test_a_forked_kernel_runs_its_exit_handlers_as_a_process_does(tmp_path, module_kernel_server):
    """A kernel shut down as jupyter shuts it down ends as `python -m ipykernel_launcher` would: its atexit handlers
    run (a set-up's temporary Trainer output_dir, removed at exit, among them)."""
    ran = tmp_path / "exit-handler-ran"
    km, client = started(tmp_path, {"WORKBENCH_BATCH": "1"})
    try:
        content, out = run(client, f"import atexit, os, pathlib\natexit.register(pathlib.Path({str(ran)!r}).write_text, "
                                   "'ran')\nprint(os.getppid())")
        assert content["status"] == "ok" and int(out) == module_kernel_server.pid, (content, out)  # forked
        _, pid = run(client, "import os\nprint(os.getpid())")
    finally:
        client.stop_channels()
        km.shutdown_kernel()  # a shutdown request: the kernel ends itself
    assert ran.read_text() == "ran", module_kernel_server.log.read_text()[-3000:]
    # reaped and logged before its client is told, and so before the shutdown returns
    assert f"kernel server: {int(pid)} ended (exit 0)" in module_kernel_server.log.read_text()


@pytest.mark.slow
def test_an_environment_the_server_cannot_honour_gets_a_kernel_started_as_usual(tmp_path, module_kernel_server):
    km, client = started(tmp_path, {"HF_HOME": str(tmp_path / "hub")})
    try:
        content, out = run(client, "import os, sys\nprint(os.getppid(), os.environ['HF_HOME'])\n" + LOGGED)
        assert content["status"] == "ok", content
        parent, hub = out.split()[:2]
        assert int(parent) != module_kernel_server.pid and hub == str(tmp_path / "hub")
        assert "said-by-transformers" in out
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def test_only_variables_read_at_run_time_may_differ():
    base = {"HF_HOME": "/a", "WORKBENCH_BATCH": "1", "PYTHONPATH": "/x"}
    assert refusal({**base, "WORKBENCH_BATCH": "0", "PYTHONPATH": "/y", "PYTEST_CURRENT_TEST": "t"}, base) is None
    assert refusal({**base, "HF_HOME": "/b"}, base) == "the environment differs in HF_HOME"
    assert refusal({k: v for k, v in base.items() if k != "HF_HOME"}, base) == "the environment differs in HF_HOME"
    assert "HF_HOME" not in RUN_TIME_VARIABLES and "TMPDIR" not in RUN_TIME_VARIABLES
    # a user's secrets: the Hub token is read at each call, the wandb key only once wandb is imported
    secrets = {**base, "HF_TOKEN": "hf_x", "WANDB_API_KEY": "k"}
    assert refusal(secrets, base, imported={"torch", "huggingface_hub"}) is None
    assert refusal(secrets, base, imported={"torch", "wandb"}) == "the environment differs in WANDB_API_KEY"
    # a torchrun rank started from a notebook: torchrun's variables and the kernel's own for its processes
    rank = {**base, "RANK": "1", "TORCHELASTIC_RUN_ID": "x", "TERM": "xterm-color", "MPLBACKEND": "agg"}
    assert refusal(rank, base, imported={"torch"}) is None
    assert refusal(rank, base, imported={"torch", "matplotlib"}) == "the environment differs in MPLBACKEND"
    assert refusal({**base, "OMP_NUM_THREADS": "1"}, base) == "the environment differs in OMP_NUM_THREADS"
    # a sweep member's kernel started in a Ray worker: what Ray and its raylet give the worker
    worker = {**base, "RAY_JOB_ID": "01000000", "RAY_RAYLET_PID": "7", "SPT_NOENV": "1",
              "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace"}
    assert refusal(worker, base, imported={"torch"}) is None
    assert refusal(worker, base, imported={"torch", "ray"}) == "the environment differs in RAY_JOB_ID, RAY_RAYLET_PID, SPT_NOENV"


RANK_MODULE = '''import json, os, sys
imported_before = "transformers.trainer" in sys.modules
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
out = sys.argv[sys.argv.index("--out") + 1]
with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"ppid": os.getppid(), "imported_before": imported_before, "total": total.item(),
               "argv": sys.argv[1:], "unbuffered": sys.stdout.write_through, "first_path": sys.path[0]}, f)
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_torchrun_ranks_are_forked_from_the_server_and_talk_over_gloo(tmp_path, module_kernel_server, monkeypatch):
    """Where a server runs, `launch_ranks` has torchrun start each rank through the server's client: the rank is
    `python -m MODULE ARGS` (its argv, its working folder first on sys.path, PYTHONUNBUFFERED's streams), forked
    with the stack imported, and the ranks
    reduce over gloo as any two ranks do."""
    from workbench.distributed.launcher import launch_ranks

    (tmp_path / "served_rank.py").write_text(RANK_MODULE)
    monkeypatch.chdir(tmp_path)  # rank_environment puts the working folder on PYTHONPATH
    run = launch_ranks("served_rank", ["--out", str(tmp_path)], ranks=2, timeout=120, out_dir=tmp_path)
    assert run.ok and sorted(run.results) == [0, 1], run.output_tail + module_kernel_server.log.read_text()
    # torch elastic's log folder is the launch's own, which its caller removes, not a torchelastic_* folder of the
    # system's temporary folder left behind at every launch
    assert [p.name for p in (tmp_path / "torchelastic").iterdir()], run.output_tail
    for result in run.results.values():
        assert result == {"ppid": module_kernel_server.pid, "imported_before": True, "total": 3.0,
                          "argv": ["--out", str(tmp_path)], "unbuffered": True, "first_path": str(tmp_path)}, \
            module_kernel_server.log.read_text()


@pytest.mark.slow
def test_a_diagnosis_in_a_forked_kernel_reports_what_it_reports_in_a_fresh_one(tmp_path, module_kernel_server):
    """The same diagnosis (`python -m workbench diagnose`, notebooks 00, 01 and 04 on a tiny GPT-2) with its kernel
    forked from the server and started as usual: the same findings and the same text in every cell's output (digits
    masked: timings, memory)."""
    import json
    import re

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).save_pretrained(
        tmp_path / "tiny-gpt2")
    forked_before = module_kernel_server.log.read_text().count("forked a kernel")
    reports = {}
    for name, address in (("forked", os.environ[SERVER_ENV]), ("fresh", "")):
        result = subprocess.run([sys.executable, "-m", "workbench", "diagnose", "tiny-gpt2", "--notebooks", "00", "01",
                                 "04", "--reports-dir", name], capture_output=True, text=True, timeout=600,
                                cwd=tmp_path, env={**os.environ, SERVER_ENV: address}, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stdout + result.stderr
        reports[name] = next(p for p in (tmp_path / name).glob("*/*") if p.is_dir())
    assert module_kernel_server.log.read_text().count("forked a kernel") == forked_before + 1

    def masked(text):
        return re.sub(r"\d+", "#", text)

    def seen(report):
        findings = json.loads((report / "findings.json").read_text())["findings"]
        cells = []
        for notebook in sorted(report.glob("*.ipynb")):
            for cell in json.loads(notebook.read_text())["cells"]:
                cells.append([masked(o.get("name", o["output_type"]) + "".join(o.get("text", "")))
                              for o in cell.get("outputs", [])])
        return sorted((f["id"], f["verdict"], masked(f["title"])) for f in findings), cells

    forked, fresh = seen(reports["forked"]), seen(reports["fresh"])
    assert forked[0] == fresh[0] and len(forked[0]) > 10
    assert forked[1] == fresh[1]


def test_only_specs_of_this_interpreter_are_served(tmp_path):
    """The served spec manager rewrites a spec only where its argv[0] is this interpreter: another virtual
    environment's `python` (a link to the same binary from a folder of its own) and another file beside it keep
    their command, which the server could not fork."""
    from workbench.report.served_specs import runs_this_interpreter

    assert runs_this_interpreter(sys.executable)
    other_env = tmp_path / "other-venv" / "bin"
    other_env.mkdir(parents=True)
    (other_env / "python").symlink_to(os.path.realpath(sys.executable))
    assert not runs_this_interpreter(str(other_env / "python"))
    beside = os.path.join(os.path.dirname(sys.executable), "no-such-python")
    assert not runs_this_interpreter(beside)
