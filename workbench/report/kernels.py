"""The kernel a diagnosis runs its notebooks in: one for all of them, a fresh one after a notebook killed it.

One kernel means one start-up (~4 s of imports) and one prepared model shared by every notebook
(`workbench.model.shared`). Isolation is kept where it matters: a notebook that raises is an artifact and the next
notebook runs in the same kernel; a notebook that kills its kernel (out of memory, a native crash) or hangs past
its cell timeout leaves the next notebooks a fresh kernel, and the report says so. The kernel's own console
(start-up chatter, "KeyboardInterrupt caught in kernel" at shutdown) goes to a log file in the report folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import IO

KERNEL_NAME = "workbench"
# sent the moment a kernel starts, before papermill connects: the stack's imports (~4 s on 2 cores) then overlap the
# runner's own start-up (papermill, nbconvert) instead of following it. gc.freeze() then moves what the imports
# created (it lives as long as the kernel) out of the cyclic collector's reach: each gc.collect() the probes run
# when they free a model scans the objects made since, 0.08 s instead of 0.26 s on a tiny checkpoint
WARM_UP = ("import torch, transformers, pandas, workbench.notebook\nfrom transformers import AutoConfig, PreTrainedModel\n"
           "import gc\ngc.freeze()")


class Kernel:
    """The diagnosis' kernel. It may start before the report folder exists (the CLI starts it while it still
    validates the target), so its console goes to a private temporary log that `save_log` copies into the report."""

    def __init__(self, name: str = KERNEL_NAME, warm_up: bool = True) -> None:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="workbench-kernel-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)
        self.name = name
        self.warm_up = warm_up  # import the stack the workbench's notebooks use as soon as a kernel starts
        self.km = None
        self.started = 0  # kernels started for this diagnosis
        self._log: IO[bytes] | None = None
        self._client = None  # the warm-up's client
        self._notebook_client = None  # the client every notebook executes through (`client()`)

    def manager(self):
        """A live kernel manager: the current kernel, or a new one when there is none or it died."""
        if self.alive():
            return self.km
        self.discard()
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        # the async manager nbclient itself would create: its client honours the cell timeout and notices a dead
        # kernel while waiting (a blocking client's waits do neither)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in discard()
        km = AsyncKernelManager(kernel_name=self.name)
        run_sync(km.start_kernel)(stdout=self._log, stderr=self._log,
                                  extra_arguments=["--IPKernelApp.log_level=ERROR"])
        self.km = km
        self.started += 1
        if self.warm_up:
            self._warm_up(km)
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

    def client(self):
        """A connected, ready client of the live kernel, made once per kernel and handed to every notebook.

        nbclient would connect a new client per notebook, and jupyter_client's `wait_for_ready` ends each connection
        by draining IOPub until 0.2 s pass with no message: 0.2 s of idle before every notebook (jupyter_client
        8.10, client.py `_async_wait_for_ready`). nbclient reads only the messages whose parent is the request it
        sent, so one client serves the notebooks one after another."""
        km = self.manager()
        if self._notebook_client is None:
            from jupyter_core.utils import run_sync

            client = km.client()
            client.start_channels()
            run_sync(client.wait_for_ready)(timeout=60)
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
        if self._log is not None:
            self._log.close()
            self._log = None

    def save_log(self, destination: Path) -> None:
        """Copy what every kernel of this diagnosis printed so far to `destination`."""
        shutil.copyfile(self.log_path, destination)

    def close(self) -> None:
        """Shut the kernel down and remove the temporary log."""
        self.discard()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
