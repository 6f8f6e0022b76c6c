"""The diagnosis' kernel (`workbench.report.kernels`): the client every notebook executes through."""

import os

import pytest
from jupyter_core.utils import run_sync

from workbench.report.kernels import Kernel


async def _outputs_of(client, msg_id: str) -> tuple[list[str], list[str]]:
    """The stream text a request printed, read from IOPub until its `idle` status, and the request types of the
    other messages read on the way (another client's request, or one of the client's own before it)."""
    texts, others = [], []
    while True:
        msg = await client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            others.append(msg["parent_header"].get("msg_type"))
            continue
        if msg["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return texts, others


@pytest.mark.slow  # a kernel
def test_the_notebook_client_is_ready_with_its_own_request_read_to_the_end():
    """`Kernel.client()` waits for the reply to its kernel_info and that request's idle status on IOPub, not for
    0.2 s of silence: IOPub is connected (the first request's output arrives), and every message of that kernel_info
    was read before the client was handed out. IOPub is one ordered stream, so a status of it still unread would
    come before the first request's output. (Another client's request, the quiet import `manager()` queues, may be
    answered on either side of it: nbclient reads only its own request's messages.)"""
    with Kernel(warm_up=False) as kernel:
        client = kernel.client()
        assert kernel.client() is client  # one per kernel, for every notebook
        msg_id = client.execute("print('the first output')")
        texts, others = run_sync(_outputs_of)(client, msg_id)
        assert texts == ["the first output\n"]
        assert "kernel_info_request" not in others, others
        # started with KERNEL_ARGUMENTS: no input history, whose sqlite commits each cell would wait on
        msg_id = client.execute("print(get_ipython().history_manager.enabled)")
        assert run_sync(_outputs_of)(client, msg_id)[0] == ["False\n"]


@pytest.mark.slow  # a kernel
def test_a_light_kernel_is_forked_where_a_kernel_server_serves():
    """`Kernel(warm_up=False)` (a sweep's page) gets a kernel forked from this worker's server where it runs: its
    start is a fork, the stack it would not import already there; started as usual elsewhere."""
    from tests import served_kernels

    server = served_kernels.running()
    if server is None or not served_kernels.would_fork(dict(os.environ)):
        pytest.skip("no kernel server serves this environment (a session run without one)")
    served_kernels.wait_for_socket(server, server.socket)
    with Kernel(warm_up=False) as kernel:
        client = kernel.client()
        msg_id = client.execute("import os, sys; print(os.getppid(), 'torch' in sys.modules)")
        texts, _ = run_sync(_outputs_of)(client, msg_id)
    assert texts == [f"{server.pid} True\n"], texts
