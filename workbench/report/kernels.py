"""The kernel a diagnosis runs its notebooks in: one for all of them, a fresh one after a notebook killed it.

One kernel means one start-up (~4 s of imports) and one prepared model shared by every notebook
(`workbench.model.shared`). Isolation is kept where it matters: a notebook that raises is an artifact and the next
notebook runs in the same kernel; a notebook that kills its kernel (out of memory, a native crash) or hangs past
its cell timeout leaves the next notebooks a fresh kernel, and the report says so. The kernel's own console
(start-up chatter, "KeyboardInterrupt caught in kernel" at shutdown) goes to a log file in the report folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from workbench.report.kernel_imports import WARM_UP

KERNEL_NAME = "workbench"
# every kernel a diagnosis starts: start-up chatter kept out of the console log, and no IPython input history. A
# notebook run needs none, and its sqlite file costs each cell: the cell's input waits on a lock the history's
# saving thread holds while it commits to disk (0.1 s of a diagnosis' ~80 cells on this project's machine)
KERNEL_ARGUMENTS = ("--IPKernelApp.log_level=ERROR", "--HistoryManager.enabled=False")


class Kernel:
    """The diagnosis' kernel. It may start before the report folder exists (the CLI starts it while it still
    validates the target), so its console goes to a private temporary log that `save_log` copies into the report.
    The log has no name: its file is removed from the temporary folder as it is made, and lives while this process
    holds it, so a process that ends without `close()` (a Ray worker force-exited when its job ends, a CLI killed)
    leaves nothing there. Every kernel this object starts appends to it (O_APPEND); `save_log` reads it by offset."""

    def __init__(self, name: str = KERNEL_NAME, warm_up: bool = True, env: dict[str, str] | None = None) -> None:
        import fcntl
        import tempfile

        fd, path = tempfile.mkstemp(prefix="workbench-kernel-", suffix=".log")
        os.unlink(path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)  # each write at the end
        self._console: IO[bytes] | None = os.fdopen(fd, "ab")
        self.name = name
        self.warm_up = warm_up  # import the stack the workbench's notebooks use as soon as a kernel starts
        self.env = dict(env or {})  # set in each kernel's environment over this process's own
        self.km = None
        self.started = 0  # kernels started for this diagnosis (for a kept kernel: since its diagnosis began)
        self.diagnoses = 0  # diagnoses begun in this kernel (`begin_diagnosis`)
        self._log_from = 0  # where the console log not yet saved into a report starts
        self._client = None  # the warm-up's client
        self._notebook_client = None  # the client every notebook executes through (`client()`)

    def manager(self):
        """A live kernel manager: the current kernel, or a new one when there is none or it died."""
        if self.alive():
            return self.km
        if self._console is None:
            raise RuntimeError("this Kernel was closed: make a new one")
        self.discard()
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        # the async manager nbclient itself would create: its client honours the cell timeout and notices a dead
        # kernel while waiting (a blocking client's waits do neither)
        km = AsyncKernelManager(kernel_name=self.name, **served_kernel_specs())
        run_sync(km.start_kernel)(stdout=self._console, stderr=self._console, env={**os.environ, **self.env},
                                  extra_arguments=list(KERNEL_ARGUMENTS))
        self.km = km
        self.started += 1
        if self.warm_up:
            self._warm_up(km)
        # queued, not awaited: the module takes the kernel's environment before any notebook runs, to restore it
        # for a later diagnosis in this kernel (`begin_diagnosis`)
        self._client_of(km).execute("import workbench.report.kernel_reset", silent=True, store_history=False)
        return km

    def _warm_up(self, km) -> None:
        """Queue the stack's imports in the new kernel without waiting for them (silent: no output, no execution
        count; a failing import fails again, visibly, in the first notebook)."""
        from jupyter_client.blocking import BlockingKernelClient

        client = BlockingKernelClient()
        client.load_connection_info(km.get_connection_info())
        client.start_channels(iopub=False, stdin=False, hb=False, control=False)
        client.execute(WARM_UP, silent=True, store_history=False)
        self._client = client

    def begin_diagnosis(self, notebooks: list[str], setup: str, timeout: float = 300) -> None:
        """Called before each diagnosis that runs in this kernel. The first one gets the kernel as started; a later
        one (a sweep's members in series: one kernel, one start-up of the stack) gets it made as a fresh kernel
        would be (`workbench.report.kernel_reset`): its count of kernels starts here, its console log where the
        previous report's ended (`save_log`). Where the
        kept kernel cannot be reset (its peak memory, on a system without Linux's clear_refs) or did not answer,
        it is shut down and the diagnosis gets a fresh one."""
        self.diagnoses += 1
        if self.diagnoses == 1:
            return
        reset, before = False, self.started
        if self.alive():
            module = "__import__('workbench.report.kernel_reset', fromlist=['_'])"
            call = f"{module}.begin_next_diagnosis({notebooks!r}, {setup!r})"
            # the namespace cleared in the cell, the rest as an expression after it: its answer comes back
            content = self._run_quietly(f"{module}.forget_the_namespace()", timeout, expressions={"fresh": call})
            answer = ((content or {}).get("user_expressions") or {}).get("fresh") or {}
            reset = answer.get("status") == "ok" and answer.get("data", {}).get("text/plain") == "True"
        if not reset:
            self.discard()
        # a kernel that died as the reset began was replaced by a fresh one: started for this diagnosis
        self.started = 1 if reset and self.started > before else 0

    def release_the_model(self, timeout: float = 120) -> bool:
        """A kept kernel about to wait idle: the last diagnosis' namespace, model and memory given back now
        (`kernel_reset.release_the_model`). False, and the kernel shut down, where that cannot be done."""
        if not self.alive():
            return False
        content = self._run_quietly("__import__('workbench.report.kernel_reset', fromlist=['_']).release_the_model()",
                                    timeout)
        if (content or {}).get("status") == "ok":
            return True
        self.discard()
        return False

    def _run_quietly(self, code: str, timeout: float, expressions: dict[str, str] | None = None) -> dict | None:
        """Execute `code` in this kernel without output or history (after the warm-up's imports): the reply's
        content, None when the kernel died or gave no answer in `timeout`. `expressions`: evaluated after it,
        their values in the reply's `user_expressions`."""
        import queue
        import time

        client = self._client_of(self.manager())
        deadline = time.monotonic() + timeout
        for _attempt in range(3):
            # stop_on_error=False: a failing request of ours aborts nothing queued behind it
            msg_id = client.execute(code, silent=True, store_history=False, user_expressions=expressions or {},
                                    stop_on_error=False)
            content = None
            while content is None and time.monotonic() < deadline:
                try:
                    reply = client.get_shell_msg(timeout=1)
                except queue.Empty:
                    if not self.alive():
                        return None
                    continue
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    content = reply["content"]
            # "aborted": it arrived while ipykernel was aborting the requests queued behind a notebook cell that
            # failed (kernelbase.py `_abort_queues`), not run at all: sent again
            if content is None or content.get("status") != "aborted":
                return content
        return None

    def _client_of(self, km):
        """The client of quiet requests (the warm-up's, else a new one on the shell channel)."""
        if self._client is None:
            from jupyter_client.blocking import BlockingKernelClient

            client = BlockingKernelClient()
            client.load_connection_info(km.get_connection_info())
            client.start_channels(iopub=False, stdin=False, hb=False, control=False)
            self._client = client
        return self._client

    def check_target(self, target, timeout: float = 900) -> bool:
        """`check_with_the_stack` for `target`, run in this kernel once its warm-up imports are done: the CLI keeps
        torch and transformers out of its own process (6-7 s of CPU on 2 cores, paid again by the kernel anyway).
        A UsageError there is raised here with its message; another exception is a KernelCheckError carrying the
        kernel's traceback. False when the kernel died or gave no answer in `timeout`: the caller checks in its own
        process."""
        from workbench.errors import UsageError

        code = (f"__import__('workbench.model.target', fromlist=['_']).check_with_the_stack({target.setup!r}, "
                f"__import__('pathlib').Path({str(target.model_dir)!r}), {bool(target.trust_remote_code)!r})")
        content = self._run_quietly(code, timeout)
        if content is None:
            return False
        if content.get("status") == "ok":
            return True
        if content.get("ename") == "UsageError":
            raise UsageError(content.get("evalue", ""))
        raise KernelCheckError(f"{content.get('ename')}: {content.get('evalue')}",
                               _plain("\n".join(content.get("traceback", []))))

    def client(self):
        """A connected, ready client of the live kernel, made once per kernel and handed to every notebook.

        nbclient would connect a new client per notebook, and jupyter_client's `wait_for_ready` ends each connection
        by draining IOPub until 0.2 s pass with no message: 0.2 s of idle before every notebook (jupyter_client
        8.10, client.py `_async_wait_for_ready`). nbclient reads only the messages whose parent is the request it
        sent, so one client serves the notebooks one after another; it is made ready by `ready` (no closing 0.2 s)."""
        km = self.manager()
        if self._notebook_client is None:
            from jupyter_core.utils import run_sync

            client = km.client()
            client.start_channels()
            run_sync(ready)(client, timeout=60)
            client.allow_stdin = False
            self._notebook_client = client
        return self._notebook_client

    def alive(self) -> bool:
        from jupyter_core.utils import run_sync

        return self.km is not None and bool(run_sync(self.km.is_alive)())

    def discard(self) -> None:
        """Shut the kernel down (the next notebook gets a fresh one)."""
        for client in (self._client, self._notebook_client):
            if client is not None:
                client.stop_channels()
        self._client = self._notebook_client = None
        if self.km is not None:
            try:
                from jupyter_core.utils import run_sync

                run_sync(self.km.shutdown_kernel)(now=True)
            except Exception:  # noqa: BLE001 - a dead kernel may refuse even that
                pass
            self.km = None

    def save_log(self, destination: Path) -> None:
        """Copy what every kernel of this diagnosis printed so far to `destination` (a kept kernel: since this
        diagnosis began)."""
        with open(destination, "wb") as out:
            while self._console is not None:
                chunk = os.pread(self._console.fileno(), 1 << 20, self._log_from)
                if not chunk:
                    break
                out.write(chunk)
                self._log_from += len(chunk)  # a kept kernel's next diagnosis: what it prints from here on

    def close(self) -> None:
        """Shut the kernel down and let its temporary log go."""
        self.discard()
        if self._console is not None:
            self._console.close()
            self._console = None

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class KernelCheckError(RuntimeError):
    """An exception the kernel raised while checking the target; `kernel_traceback` is its traceback there."""

    def __init__(self, message: str, kernel_traceback: str) -> None:
        super().__init__(message)
        self.kernel_traceback = kernel_traceback


async def ready(client, timeout: float) -> None:
    """jupyter_client's `wait_for_ready` for an async client, without the 0.2 s of silence it waits for at its end: a
    kernel_info request is answered on the shell channel, then its `idle` status comes on IOPub. That status is the
    last message the kernel publishes for the request, so IOPub is connected (a subscription made too late for it
    is retried with a new request, as jupyter_client retries) and every message of the request has been read;
    another client's request (the quiet import `manager()` queues) may be answered on either side of it, and
    nbclient reads only its own request's messages. The reply is handled as jupyter_client handles it (the protocol
    version the session adapts to)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        msg_id = client.kernel_info()
        reply = await _message_for(client.get_shell_msg, msg_id, "kernel_info_reply", wait=1)
        if reply is not None and await _message_for(client.get_iopub_msg, msg_id, "status", wait=1,
                                                    state="idle") is not None:
            client._handle_kernel_info_reply(reply)
            return
        if not await client.is_alive():
            raise RuntimeError("Kernel died before replying to kernel_info")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")


async def _message_for(get, msg_id: str, msg_type: str, wait: float, state: str | None = None) -> dict | None:
    """The first message of `msg_type` (a status: of execution `state`) answering request `msg_id`, read from one
    channel within `wait` seconds; the others read on the way are dropped. None when none came."""
    import time
    from queue import Empty

    end = time.monotonic() + wait
    while (left := end - time.monotonic()) > 0:
        try:
            msg = await get(timeout=left)
        except Empty:
            return None
        if (msg.get("parent_header", {}).get("msg_id") == msg_id and msg.get("msg_type") == msg_type
                and (state is None or msg.get("content", {}).get("execution_state") == state)):
            return msg
    return None


def _plain(text: str) -> str:
    """IPython's coloured traceback without its terminal colour codes."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def served_kernel_specs() -> dict:
    """The kernel manager's options where a kernel server runs (`workbench.report.kernel_server`, named by
    WORKBENCH_KERNEL_SERVER): a spec manager whose ipykernel command is the server's client instead. Empty otherwise
    (jupyter's own spec manager). A light kernel (`warm_up=False`: a sweep's page, which reads reports; a diagnosis
    of notebooks of one's own, `runner.diagnose(notebook_dir=...)`) is forked too: the stack it would not import is
    there at no cost, and what its code imports (the page's pandas, a notebook's torch) is there already. A light
    kernel started and a first cell importing pandas run: 0.6 s of CPU and 0.7-0.9 s of wall started as usual,
    0.5-0.6 s of wall forked (2 cores)."""
    from workbench.report.kernel_server import SERVER_ENV

    if not os.environ.get(SERVER_ENV):
        return {}
    from workbench.report.served_specs import ServedKernelSpecManager

    return {"kernel_spec_manager": ServedKernelSpecManager()}

