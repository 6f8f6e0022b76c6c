"""One kernel for a sweep's members in series (workbench.report.kernel_reset): between two diagnoses it is made as a
fresh kernel would be, and where it cannot be (its peak memory not resettable) the next diagnosis gets a fresh one."""

import pytest

from workbench.peak_memory import peak_rss_bytes, reset_peak_rss
from workbench.report.kernels import Kernel

pytestmark = pytest.mark.slow  # a real kernel

STATE = {
    "pid": "__import__('os').getpid()",
    "variable": "'planted' in get_ipython().user_ns",
    "user_module": "'user_recipe' in __import__('sys').modules",
    "installed_module": "'yaml' in __import__('sys').modules",
    "loads": "len(__import__('workbench.model.loading', fromlist=['_']).LOADS)",
    "notebooks": "__import__('os').environ.get('WORKBENCH_NOTEBOOKS')",
    "peak": "__import__('workbench.peak_memory', fromlist=['_']).peak_rss_bytes()",
}


def state_of(kernel: Kernel) -> dict:
    reply = kernel._run_quietly("", 120, expressions=STATE)
    assert reply and reply["status"] == "ok", reply
    values = reply["user_expressions"]
    assert all(v["status"] == "ok" for v in values.values()), values
    return {k: eval(v["data"]["text/plain"]) for k, v in values.items()}  # noqa: S307 - reprs of ints, bools, str


PLANT = ("import user_recipe, yaml\nplanted = bytearray(300 * 2**20)\nplanted[::4096] = b'x' * len(planted[::4096])\n"
         "from workbench.model.loading import LOADS\nLOADS.append({'folder': 'previous member'})\ndel planted[:]\n"
         "planted = 1")


def test_between_diagnoses_the_kept_kernel_forgets_the_previous_one(tmp_path):
    (tmp_path / "user_recipe.py").write_text("MODELS = []  # a user's module that keeps what it loaded\n")
    with Kernel(warm_up=False, env={"PYTHONPATH": str(tmp_path)}) as kernel:
        kernel.manager()  # started, as `start_kernel` starts a sweep's kernel
        kernel.begin_diagnosis(["00_saved_files"], "plain")  # the first diagnosis: the kernel as started
        assert kernel.started == 1
        reply = kernel._run_quietly(PLANT, 120)
        assert reply and reply["status"] == "ok", reply
        before = state_of(kernel)
        assert before["variable"] and before["user_module"] and before["loads"] == 1
        assert before["peak"] > 300 * 2**20

        kernel.begin_diagnosis(["08_training_run"], "user_recipe:load")
        after = state_of(kernel)
        assert after["pid"] == before["pid"] and kernel.started == 0  # the same process: no start-up paid
        assert not after["variable"] and after["loads"] == 0 and after["notebooks"] == "08_training_run"
        assert not after["user_module"] and after["installed_module"]  # the user's code imported again, not yaml
        assert after["peak"] < before["peak"] - 250 * 2**20  # this diagnosis' peak, not the previous one's


def test_a_kernel_whose_peak_cannot_be_reset_is_replaced_by_a_fresh_one(tmp_path):
    with Kernel(warm_up=False) as kernel:
        kernel.begin_diagnosis(["00_saved_files"], "plain")
        first = state_of(kernel)["pid"]
        reply = kernel._run_quietly("import workbench.peak_memory as p\np.CLEAR_REFS = '/proc/self/no-such-file'", 60)
        assert reply and reply["status"] == "ok", reply
        kernel.begin_diagnosis(["00_saved_files"], "plain")
        assert not kernel.alive() and kernel.started == 0  # shut down: the diagnosis starts a fresh one
        assert state_of(kernel)["pid"] != first and kernel.started == 1


def test_the_peak_is_read_and_reset_in_this_process():
    held = bytearray(200 * 2**20)
    held[::4096] = b"x" * len(held[::4096])
    peak = peak_rss_bytes()
    del held
    assert reset_peak_rss()
    assert peak_rss_bytes() < peak - 150 * 2**20
