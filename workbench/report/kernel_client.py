"""The kernel command where a kernel server runs (`workbench.report.kernel_server`): the process jupyter_client
starts and manages as the kernel.

    python -m workbench.report.kernel_client -f CONNECTION_FILE [ipykernel options]
    python -m workbench.report.kernel_client --module MODULE [ARGS]     # a torchrun rank: python -m MODULE ARGS

It sends the server its environment, working folder, standard streams and arguments; the server forks the kernel.
It then stands for the kernel: signals it gets (an interrupt, a termination) go to the kernel's process group, it
exits with the kernel's exit code, and if it is killed the server kills the kernel. It also exits when the process
that started it is gone (killed outright: a JupyterLab, a Ray worker, a torchrun), as ipykernel's parent poller has
a kernel exit, and the server then kills the kernel: a forked kernel's parent is the server, so ipykernel's own
poller does not see its launcher go. Where no server answers or the
server refuses (an environment a forked kernel would not honour), it becomes `python -m ipykernel_launcher` with
the same arguments. Imports nothing of the stack: it starts in tens of milliseconds.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys

from workbench.report.kernel_server import SERVER_ENV, receive_message, send_message

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
LAUNCHER_POLL_S = 1.0  # how often it looks whether the process that started it is still there (ipykernel: 1 s)


def served_module(module: str, args: list[str]) -> list[str]:
    """What follows `python -m` to run `module args`: through this client where a kernel server runs (the process
    forked from it, the stack imported), else the module itself."""
    if os.environ.get(SERVER_ENV):
        return ["workbench.report.kernel_client", "--module", module, *args]
    return [module, *args]


def start_as_usual(module: str | None, argv: list[str]) -> None:
    """This process becomes `python [its own interpreter options] -m MODULE ARGV` (ipykernel_launcher for a
    kernel): the command it stands in for, the kernel spec's options (`-Xfrozen_modules=off`) kept."""
    options = sys.orig_argv[1:sys.orig_argv.index("-m")] if "-m" in sys.orig_argv else []
    os.execv(sys.executable, [sys.executable, *options, "-m", module or "ipykernel_launcher", *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the process that started it, taken first: taken after the server's answer, a launcher killed while the
    # client waited for it would already be gone, its new parent taken for it, and the kernel would run on
    launcher = os.getppid()
    module = None
    if argv[:1] == ["--module"]:  # a torchrun rank: `python -m MODULE ARGV` instead of a kernel
        module, argv = argv[1], argv[2:]
    path = os.environ.get(SERVER_ENV)
    if not path:
        start_as_usual(module, argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        send_message(sock, {"module": module, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()},
                     fds=[0, 1, 2])
        reply, _ = receive_message(sock)
    except OSError:
        reply = None
    if not reply or "pid" not in reply:
        sock.close()
        start_as_usual(module, argv)
    pid = reply["pid"]

    def forward(signum, _frame):
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    while True:
        if not select.select([sock], [], [], LAUNCHER_POLL_S)[0]:
            if os.getppid() != launcher:  # reparented: whoever started it is gone, and the kernel goes with it
                return 1
            continue
        try:
            message, _ = receive_message(sock)
        except InterruptedError:
            continue
        except OSError:
            message = None
        if message is None:  # the server went: so did the kernel (it dies with its parent)
            return 1
        if "exit" in message:
            code = message["exit"]
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
