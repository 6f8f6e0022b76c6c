"""The kernel spec manager where a kernel server runs (`workbench.report.kernel_server`, named by
WORKBENCH_KERNEL_SERVER): each spec's ipykernel command is the server's client (`workbench.report.kernel_client`),
which has the server fork the kernel with the stack imported, and becomes `python -m ipykernel_launcher` where the
server refuses the environment or none answers. A diagnosis' kernels use it (`kernels.served_kernel_specs`), and
so do JupyterLab's where `interactive.lab.lab_server` starts one beside a server (its
`--ServerApp.kernel_spec_manager_class`)."""

from __future__ import annotations

from jupyter_client.kernelspec import KernelSpecManager


class ServedKernelSpecManager(KernelSpecManager):
    def get_kernel_spec(self, kernel_name):
        spec = super().get_kernel_spec(kernel_name)
        if "ipykernel_launcher" in spec.argv:
            spec.argv[spec.argv.index("ipykernel_launcher")] = "workbench.report.kernel_client"
        return spec
