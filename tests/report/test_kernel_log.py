"""The kernel's console log (`report.kernels.Kernel`): nameless, so a process that ends without closing its kernel
leaves nothing in the temporary folder; each report gets what the kernels printed since the previous one."""

import os
import subprocess
import sys

import pytest

from workbench.report.kernels import Kernel


def test_a_process_that_ends_without_closing_its_kernel_leaves_no_log(tmp_path):
    """A Ray worker is force-exited when its sweep's job ends, its atexit handlers unrun: its kept kernel's
    `close()` never runs."""
    result = subprocess.run([sys.executable, "-c", "import os\nfrom workbench.report.kernels import Kernel\n"
                             "kernel = Kernel()\nprint(len(os.listdir(os.environ['TMPDIR'])))\nos._exit(0)"],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0"] and not list(tmp_path.iterdir())  # nameless while it lived, too


def printed(kernel: Kernel, text: str) -> None:
    """`text` written to the kernel's standard error, as its own console output is (not through a cell's stream).
    ipykernel leaves the descriptor uncaptured in a test's kernel (PYTEST_CURRENT_TEST, which the test process
    gives its kernels), so the write reaches the console log as its start-up chatter does."""
    line = (text + "\n").encode()
    reply = kernel._run_quietly(f"import os\nos.write(2, {line!r})", 60)
    assert reply and reply["status"] == "ok", reply


@pytest.mark.slow  # real kernels
def test_each_saved_log_holds_what_the_kernels_printed_since_the_last(tmp_path):
    with Kernel(warm_up=False) as kernel:
        printed(kernel, "first-diagnosis")
        kernel.save_log(tmp_path / "first.log")
        printed(kernel, "second-diagnosis")
        kernel.save_log(tmp_path / "second.log")
        kernel.discard()  # a notebook killed it: the next one gets a fresh kernel, which writes to the same log
        printed(kernel, "after-a-fresh-kernel")
        kernel.save_log(tmp_path / "third.log")
    first, second, third = ((tmp_path / f"{n}.log").read_text() for n in ("first", "second", "third"))
    assert "first-diagnosis" in first and "second-diagnosis" not in first
    assert "second-diagnosis" in second and "first-diagnosis" not in second
    assert "after-a-fresh-kernel" in third and "second-diagnosis" not in third
