"""The papermill engine the report runner executes notebooks with: papermill's own nbclient engine, with two
differences that take idle time out of every notebook.

- The executed notebook is written once, when the notebook ends (finished, failed, timed out, or its kernel died),
  not after every cell's start and end. papermill writes (and validates) the whole notebook twice per cell so a long
  run can be watched on disk; the workbench's console already says which notebook runs. Those writes sit between
  one cell's end and the next cell's start: on a tiny checkpoint, 282 writes were 1.5 s of a 15 s diagnosis. The
  partial notebook of a run that stops is still written, so its HTML shows the cell it stopped in.
- `kc`: the notebook runs through a client already connected to the shared kernel (`Kernel.client()`), not a new
  one per notebook.
"""

from __future__ import annotations

from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.iorw import write_ipynb
from papermill.log import logger
from papermill.utils import remove_args

ENGINE_NAME = "workbench"


class WorkbenchEngine(NBClientEngine):
    @classmethod
    def execute_notebook(cls, nb, kernel_name, output_path=None, **kwargs):
        # papermill's execution manager updates `nb` in place, so what ran so far is in it whatever is raised
        try:
            return super().execute_notebook(nb, kernel_name, output_path=None, **kwargs)
        finally:
            if output_path:
                write_ipynb(nb, output_path)

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                 start_timeout=60, execution_timeout=None, kc=None, **kwargs):
        if kc is None:
            return super().execute_managed_notebook(nb_man, kernel_name, log_output=log_output, stdout_file=stdout_file,
                                                    stderr_file=stderr_file, start_timeout=start_timeout,
                                                    execution_timeout=execution_timeout, **kwargs)
        # papermill 2.7's own NBClientEngine.execute_managed_notebook, with the client's `kc` set before it runs:
        # nbclient's setup_kernel connects a new client only when `kc` is None
        kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
        client = PapermillNotebookClient(nb_man, timeout=execution_timeout, startup_timeout=start_timeout,
                                         kernel_name=kernel_name, log=logger, log_output=log_output,
                                         stdout_file=stdout_file, stderr_file=stderr_file, **kwargs)
        client.kc = kc
        return client.execute()


papermill_engines.register(ENGINE_NAME, WorkbenchEngine)
