"""The kernel spec manager where a kernel server runs (`workbench.report.kernel_server`, named by
WORKBENCH_KERNEL_SERVER): the ipykernel command of each spec that runs this interpreter is the server's client
(`workbench.report.kernel_client`), which has the server fork the kernel with the stack imported, and becomes
`python -m ipykernel_launcher` where the server refuses the environment or none answers. A spec of another
interpreter (another environment's kernel that JupyterLab lists) is left as it is: the server forks only its own
interpreter, and the other may not have the workbench. A diagnosis' kernels use it (`kernels.served_kernel_specs`),
and so do JupyterLab's where `interactive.lab.lab_server` starts one beside a server (its
`--ServerApp.kernel_spec_manager_class`)."""

from __future__ import annotations

import os
import shutil
import sys

from jupyter_client.kernelspec import KernelSpecManager


def runs_this_interpreter(command: str) -> bool:
    """Whether a kernel spec's argv[0] is this interpreter: the same file in the same folder (another virtual
    environment's `python` links to the same binary from a folder of its own; `python3.12` beside `python3.11` is
    in the same folder but another file)."""
    found = shutil.which(command) or command
    return (os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable))
            and os.path.exists(found) and os.path.samefile(found, sys.executable))


class ServedKernelSpecManager(KernelSpecManager):
    def get_kernel_spec(self, kernel_name):
        spec = super().get_kernel_spec(kernel_name)
        if "ipykernel_launcher" in spec.argv and runs_this_interpreter(spec.argv[0]):
            spec.argv[spec.argv.index("ipykernel_launcher")] = "workbench.report.kernel_client"
        return spec
