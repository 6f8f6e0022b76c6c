"""Kernels and torchrun ranks forked from a process that imported the stack once, for a process that starts many
diagnoses.

A kernel's start-up is mostly importing torch, transformers and pandas (`kernel_imports.WARM_UP`: about 4.7 s of
CPU on 2 cores), a torchrun rank's importing `transformers.trainer` (about 6 s), paid again by every process. A
kernel server pays it once: it imports both, and peft with bitsandbytes (about 2.7 s more, which a diagnosis's
notebooks 01 and 03 import: `kernel_imports.import_the_training_stack`), then forks a process for each request, the
child taking the requester's environment, working folder, standard streams and arguments. The child becomes the kernel
`python -m ipykernel_launcher` would start, or the rank `python -m MODULE` would be, its imports already done.

    python -m workbench.report.kernel_server SOCKET      # serves until SIGTERM, or until its launcher is gone
    WORKBENCH_KERNEL_SERVER=SOCKET workbench diagnose …  # its kernels and ranks come from the server

Where a kernel is started (`kernels.Kernel.manager`) or torchrun launched (`distributed.launcher.torchrun_command`)
the server is used when `WORKBENCH_KERNEL_SERVER` names it: the process jupyter_client or torchrun manages is then
`python -m workbench.report.kernel_client [--module MODULE]`, which asks the server for the process, forwards the
signals it gets to the child's process group and exits with the child's exit code. Modules read some variables
when they are imported (the Hub's endpoint and cache, OpenMP's thread count), so a child is forked only for an
environment equal to the server's own in every variable but those read at run time (`refusal`); for any other the
server refuses and the client starts the process as usual (exec: the same process). The test suite starts one
server per worker (tests/served_kernels.py).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
from typing import Any

SERVER_ENV = "WORKBENCH_KERNEL_SERVER"
# variables a kernel's environment may hold other values of than the server's: read at run time, never when a
# module is imported. The workbench's own (every WORKBENCH_* variable) are read by its functions; jupyter's,
# pytest's, the shell's own bookkeeping and the terminal's size by nothing the kernel imports; torch's inductor
# reads its cache folder at each use and writes it into the environment of a process that compiled once (torch
# 2.13 _inductor/runtime/cache_dir_utils.py); transformers reads FSDP's loading switch when it loads (5.23
# distributed/fsdp.py `is_fsdp_enabled`), and TrainingArguments and accelerate's FSDP plugin write it into the
# environment that built them; Ray's client switch is Ray's, which the server does not import. PYTHONPATH is applied
# to sys.path and PYTHONUNBUFFERED to the streams in the child, as Python applies them when it starts.
RUN_TIME_VARIABLES = ("PYTHONPATH", "JPY_PARENT_PID", "JPY_SESSION_NAME", "PYTEST_CURRENT_TEST", "SHLVL", "_", "PWD",
                      "OLDPWD", "COLUMNS", "LINES", "TORCHINDUCTOR_CACHE_DIR", "FSDP_CPU_RAM_EFFICIENT_LOADING",
                      "ACCELERATE_USE_FSDP", "RAY_CLIENT_MODE", "PYTHONUNBUFFERED",
                      # jupyter's folder of connection files, read at each call of jupyter_core 5's
                      # `paths.jupyter_runtime_dir` (ipykernel's connection folder, as its app initializes): the
                      # JupyterLab a test or `workbench lab` starts sets its own
                      "JUPYTER_RUNTIME_DIR",
                      # what torchrun gives each rank (torch 2.13 elastic/agent/server/local_elastic_agent.py), read
                      # by torch.distributed when the process group starts
                      "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                      "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                      # the default sys.breakpointhook reads it at each breakpoint() (Python's docs); Ray sets it in
                      # its workers (ray 2.x _private/worker.py `connect`)
                      "PYTHONBREAKPOINT",
                      # the Hub token, read at each get_token() (huggingface_hub 2.4 utils/_auth.py
                      # `_get_token_from_environment`); no module of the stack reads it when imported
                      "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
RUN_TIME_PREFIXES = ("WORKBENCH_", "TORCHELASTIC_")
# what a kernel sets for the processes it starts (ipykernel 7.4 `ZMQInteractiveShell.init_environment`: a rank that a
# notebook's torchrun starts inherits them): the terminal, pager and colour switches, read by programs at run time,
# and some read when their module is imported, free to differ where the server has not imported that module. Ray's
# own variables, and SPT_NOENV that its raylet gives its workers for the process title, are read by Ray's modules
# alone: a sweep member's kernel, started in a Ray worker, differs from the server in those.
KERNEL_VARIABLES = ("TERM", "CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "PAGER", "GIT_PAGER")
READ_ON_IMPORT_OF = {"MPLBACKEND": "matplotlib", "PYDEVD_USE_FRAME_EVAL": "_pydevd_bundle", "SPT_NOENV": "ray",
                     # read by wandb, which the server never imports: free to differ until something does
                     "WANDB_API_KEY": "wandb"}
PREFIXES_READ_ON_IMPORT_OF = {"RAY_": "ray"}
_HEADER = struct.Struct("!I")


def refusal(env: dict[str, str], base: dict[str, str], imported=None) -> str | None:
    """Why a kernel for `env` cannot be forked from a server started in `base` that imported `imported` (module
    names; default: this process') (None: it can): the variables that differ beyond those read at run time."""
    imported = sys.modules if imported is None else imported

    def read_at_run_time(name: str) -> bool:
        return (name in RUN_TIME_VARIABLES or name.startswith(RUN_TIME_PREFIXES) or name in KERNEL_VARIABLES
                or name in READ_ON_IMPORT_OF and READ_ON_IMPORT_OF[name] not in imported
                or any(name.startswith(prefix) and module not in imported
                       for prefix, module in PREFIXES_READ_ON_IMPORT_OF.items()))

    differing = sorted(k for k in set(env) | set(base) if env.get(k) != base.get(k) and not read_at_run_time(k))
    return f"the environment differs in {', '.join(differing)}" if differing else None


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    packet = _HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [packet], fds)
        if sent < len(packet):  # an empty send raises BrokenPipeError once the server has answered and closed
            sock.sendall(packet[sent:])
    else:
        sock.sendall(packet)


def receive_message(sock: socket.socket, with_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors sent with it; (None, []) when the peer closed the connection."""
    fds: list[int] = []
    if with_fds:
        data, fds, _, _ = socket.recv_fds(sock, 65536, with_fds)
    else:
        data = sock.recv(65536)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        data += chunk
    size = _HEADER.unpack_from(data)[0]
    return json.loads(data[_HEADER.size:_HEADER.size + size]), fds


def _exit_as_a_process_does(code: int) -> None:
    """End a forked child as the interpreter ends the process it stands for: its exit handlers run (`atexit`: a
    set-up's temporary folders, the libraries' own), its streams are flushed, then it exits without returning into
    the server's loop or running the server's finalizers."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream closed by the child: nothing left to flush
                pass
        os._exit(code)


class KernelServer:
    """The listening process: imports once, forks a kernel per request, reaps them and tells each client its
    kernel's exit; a client that goes away (killed) takes its kernel's process group with it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.base_env: dict[str, str] = {}
        self.kernels: dict[int, socket.socket | None] = {}  # child pid -> its client's connection (None: gone)
        # the process that started it, taken as it starts: a launcher killed outright (a test worker, a shell) never
        # sends the SIGTERM, and the server, reparented, would serve on with nobody to ask it (each one holds the
        # stack's memory). Taken later (once the socket is bound), a launcher killed as soon as the socket appears
        # could already be gone, the server's new parent taken for it, and the server would never stop
        self.launcher = os.getppid()

    def prepare(self) -> None:
        """The environment it serves, then the imports. The variables a diagnosis sets for its kernels (offline,
        quiet: `runtime.quiet_and_offline`, where not set already) are set here too, as the CLI sets them."""
        import gc

        from workbench.report.kernel_imports import WARM_UP, import_the_training_stack
        from workbench.runtime import quiet_and_offline

        os.environ[SERVER_ENV] = self.path  # as in every environment it serves
        quiet_and_offline()
        self.base_env = dict(os.environ)
        exec(compile(WARM_UP, "<kernel warm-up>", "exec"), {})  # noqa: S102 - the module's own constant
        # whatever the kernels it serves will run: peft and bitsandbytes (2.7 s), and transformers.trainer, what a
        # torchrun rank imports first; the collector off meanwhile, as in WARM_UP
        gc.disable()
        try:
            import_the_training_stack()
        finally:
            gc.freeze()  # what the imports made stays shared with the kernels, untouched by their collections
            gc.enable()  # after: on first, its next allocation would collect every object made while it was off

    def serve(self) -> None:
        # the stop signals handled before the socket exists: a server stopped once it is seen serving removes it
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        signal.signal(signal.SIGINT, lambda *_: stop.append(True))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mask = os.umask(0o177)  # the socket made 0600: whoever may connect runs code as this user
        try:
            listener.bind(self.path)
        finally:
            os.umask(mask)
        listener.listen(64)
        bound = os.stat(self.path).st_ino  # its own socket file: the one it removes when it stops
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        try:
            while not stop and os.getppid() == self.launcher:
                for key, _ in self.selector.select(timeout=0.1):
                    if key.fileobj is listener:
                        self._accept()
                    else:
                        self._client_closed(key.fileobj)
                self._reap()
        finally:
            for pid in list(self.kernels):
                _kill_group(pid)
            listener.close()
            _remove_if_same(self.path, bound)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # the connection was given up before it was taken
            return
        conn.settimeout(30)
        try:
            request, fds = receive_message(conn, with_fds=3)
        except (OSError, ValueError):
            conn.close()
            return
        if request is None or len(fds) != 3 or not isinstance(request.get("env"), dict):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        why = refusal(request["env"], self.base_env)
        if why:
            for fd in fds:
                os.close(fd)
            _answer(conn, {"refused": why})
            conn.close()
            sys.stderr.write(f"kernel server: refused: {why}\n")
            return
        try:
            pid = os.fork()
        except OSError as exc:  # out of processes or memory: the client starts its process as usual
            pid, why = None, f"the server could not fork ({exc})"
        if pid == 0:
            self._become_kernel(request, fds, conn)  # never returns
        for fd in fds:
            os.close(fd)
        if pid is None:
            _answer(conn, {"refused": why})
            conn.close()
            sys.stderr.write(f"kernel server: refused: {why}\n")
            return
        self.kernels[pid] = None  # reaped by _reap, whoever stands for it
        if not _answer(conn, {"pid": pid}):  # its client went as it asked: nobody stands for it, so it goes
            _kill_group(pid)
            conn.close()
            sys.stderr.write(f"kernel server: stopped {pid}, forked for a client that went before its answer\n")
            return
        self.kernels[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)
        sys.stderr.write(f"kernel server: forked {request.get('module') or 'a kernel'} as {pid}\n")

    def _become_kernel(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
        try:
            self.selector.close()
            self.listener.close()
            for other in self.kernels.values():
                if other is not None:  # None: a kernel whose client went, not yet reaped
                    other.close()
            conn.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.setsid()  # its own process group: the client's signals reach the kernel and what it starts
            _die_with_parent()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            take_the_request(request["env"], request["cwd"], self.base_env)
            if request.get("module"):
                run_module(request["module"], request["argv"])
            else:
                become_kernel(request["argv"])
        except BaseException as exc:  # noqa: BLE001 - the child must never return into the server's loop
            code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
            if not isinstance(exc, SystemExit):
                import traceback

                traceback.print_exc()
            _exit_as_a_process_does(code)
        _exit_as_a_process_does(0)

    def _client_closed(self, conn) -> None:
        self.selector.unregister(conn)
        for pid, other in list(self.kernels.items()):
            if other is conn:
                _kill_group(pid)  # reaped by _reap; nobody is left to tell
                self.kernels[pid] = None
                sys.stderr.write(f"kernel server: stopped {pid}, its client went\n")
        conn.close()

    def _reap(self) -> None:
        while self.kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.kernels.pop(pid, None)
            # every end in the log, how it ended with it: a kernel that died under a diagnosis (a signal) is told
            # apart from one its client stopped or shut down
            sys.stderr.write(f"kernel server: {pid} ended ({_how_it_ended(status)})\n")
            if conn is not None:
                try:
                    send_message(conn, {"exit": os.waitstatus_to_exitcode(status)})
                except OSError:
                    pass
                self.selector.unregister(conn)
                conn.close()


def _how_it_ended(status: int) -> str:
    """A wait status as a line says it: "exit 0", "killed by SIGKILL"."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def take_the_request(env: dict[str, str], cwd: str, base_env: dict[str, str]) -> None:
    """In the forked child: the requester's folder and environment, as a process started there would have them."""
    import tempfile

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _set_python_path(base_env.get("PYTHONPATH", ""), env.get("PYTHONPATH", ""))
    tempfile.tempdir = None  # taken from TMPDIR again on first use
    if env.get("PYTHONUNBUFFERED"):  # read by Python as it starts: the streams it would have made
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)


def become_kernel(argv: list[str]) -> None:
    """In the forked child: what `python -m ipykernel_launcher ARGV` would be, with the server's imports done: its
    argv, and its sys.path without the working folder (ipykernel_launcher takes it out; IPython's `init_path` puts
    what it puts back)."""
    import importlib.util
    import logging

    sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin, *argv]
    del sys.path[0]
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(argv)
    # handlers the imports made write to the streams of their time (transformers' logger to the process' stderr);
    # in a kernel that imported them itself they write to the kernel's own, which reach the notebook
    replaced = {id(sys.__stdout__): sys.stdout, id(sys.__stderr__): sys.stderr}
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in replaced:
                handler.setStream(replaced[id(handler.stream)])
    app.start()


def run_module(module: str, argv: list[str]) -> None:
    """In the forked child: `python -m MODULE ARGV` (a torchrun rank), with the server's imports done."""
    import runpy

    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _set_python_path(before: str, after: str) -> None:
    """`sys.path` as `python -m` builds it in the working folder from `after`'s PYTHONPATH instead of the server's
    folder and `before`'s: the working folder, then PYTHONPATH's entries, then the rest."""
    old = [os.path.abspath(p) for p in before.split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in old]
    sys.path[:] = [os.getcwd(), *(os.path.abspath(p) for p in after.split(os.pathsep) if p), *rest]


def _remove_if_same(path: str, inode: int) -> None:
    """Remove the server's socket file, but not a file put at its path since (another server's, after someone
    removed this one's), nor fail where it is gone already."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _answer(conn: socket.socket, message: dict[str, Any]) -> bool:
    """Send a client its answer; False where it is gone (killed right after asking: jupyter_client stopping a kernel
    as it starts, a launcher killed outright). A client's going is its own: the server serves on, and every kernel it
    forked for the others runs on."""
    try:
        send_message(conn, message)
    except OSError:
        return False
    return True


def _kill_group(pid: int) -> None:
    """A forked child and what it started: its process group (its first step makes one, `os.setsid`), and the child
    itself, which a kill in that first moment finds still in the server's group."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _die_with_parent() -> None:
    """The kernel goes when the server goes (Linux's PR_SET_PDEATHSIG; elsewhere its client still kills it)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m workbench.report.kernel_server SOCKET\n")
        return 2
    server = KernelServer(argv[0])
    server.prepare()
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
