"""The diagnosis' kernel (`workbench.report.kernels`): the client every notebook executes through."""

import pytest
from jupyter_core.utils import run_sync

from workbench.report.kernels import Kernel


async def _outputs_of(client, msg_id: str) -> list[str]:
    """The stream text a request printed, read from IOPub until its `idle` status."""
    texts = []
    while True:
        msg = await client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return texts


@pytest.mark.slow  # a kernel
def test_the_notebook_client_is_ready_with_nothing_published_before_it_left_unread():
    """`Kernel.client()` waits for the reply to its kernel_info and that request's idle status on IOPub, not for
    0.2 s of silence: the kernel's earlier messages (the quiet import `manager()` queues) are read by then, and the
    first request's output arrives on the connected IOPub."""
    with Kernel(warm_up=False) as kernel:
        client = kernel.client()
        assert kernel.client() is client  # one per kernel, for every notebook
        assert not run_sync(client.iopub_channel.msg_ready)()
        msg_id = client.execute("print('the first output')")
        assert run_sync(_outputs_of)(client, msg_id) == ["the first output\n"]
