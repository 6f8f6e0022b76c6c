"""One kernel for a sweep's members in series (workbench.report.kernel_reset): between two diagnoses it is made as a
fresh kernel would be, and where it cannot be (its peak memory not resettable) the next diagnosis gets a fresh one."""

import pytest

from workbench.report.kernels import Kernel

SLOW = pytest.mark.slow  # a real kernel: not in the fast tier

STATE = {
    "pid": "__import__('os').getpid()",
    "variable": "'planted' in get_ipython().user_ns",
    "user_module": "'user_recipe' in __import__('sys').modules",
    "installed_module": "'yaml' in __import__('sys').modules",
    "loads": "len(__import__('workbench.model.loading', fromlist=['_']).LOADS)",
    "notebooks": "__import__('os').environ.get('WORKBENCH_NOTEBOOKS')",
    "peak": "__import__('workbench.peak_memory', fromlist=['_']).peak_rss_bytes()",
    "planted_variable": "__import__('os').environ.get('PLANTED_BY_A_NOTEBOOK')",
    "home": "__import__('os').environ.get('HOME')",
    "last_error": "getattr(__import__('sys'), 'last_value', None) is not None",
    "execution_count": "get_ipython().execution_count",
}


def state_of(kernel: Kernel) -> dict:
    reply = kernel._run_quietly("", 120, expressions=STATE)
    assert reply and reply["status"] == "ok", reply
    values = reply["user_expressions"]
    assert all(v["status"] == "ok" for v in values.values()), values
    return {k: eval(v["data"]["text/plain"]) for k, v in values.items()}  # noqa: S307 - reprs of ints, bools, str


def run_cell(kernel: Kernel, code: str) -> dict:
    """A cell as a notebook runs it (numbered, in the history): the reply's content."""
    client = kernel._client_of(kernel.manager())
    msg_id = client.execute(code, silent=False, store_history=True, stop_on_error=False)
    while True:
        reply = client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


PLANT = ("import os, user_recipe, yaml\nplanted = bytearray(300 * 2**20)\nplanted[::4096] = b'x' * len(planted[::4096])\n"
         "from workbench.model.loading import LOADS\nLOADS.append({'folder': 'previous member'})\ndel planted[:]\n"
         "planted = 1\nos.environ['PLANTED_BY_A_NOTEBOOK'] = '1'\nos.environ['HOME'] = '/changed'")


@SLOW
def test_between_diagnoses_the_kept_kernel_forgets_the_previous_one(tmp_path):
    (tmp_path / "user_recipe.py").write_text("MODELS = []  # a user's module that keeps what it loaded\n")
    with Kernel(warm_up=False, env={"PYTHONPATH": str(tmp_path)}) as kernel:
        kernel.manager()  # started, as `start_kernel` starts a sweep's kernel
        kernel.begin_diagnosis(["00_saved_files"], "plain")  # the first diagnosis: the kernel as started
        assert kernel.started == 1
        home = state_of(kernel)["home"]
        reply = kernel._run_quietly(PLANT, 120)
        assert reply and reply["status"] == "ok", reply
        assert run_cell(kernel, "1 / 0")["status"] == "error"  # a cell that raised: its traceback kept by sys
        assert run_cell(kernel, "2 + 2")["status"] == "ok"
        before = state_of(kernel)
        assert before["variable"] and before["user_module"] and before["loads"] == 1
        assert before["peak"] > 300 * 2**20 and before["planted_variable"] == "1" and before["last_error"]
        assert before["execution_count"] > 1

        kernel.begin_diagnosis(["08_training_run"], "user_recipe:load")
        after = state_of(kernel)
        assert after["pid"] == before["pid"] and kernel.started == 0  # the same process: no start-up paid
        assert not after["variable"] and after["loads"] == 0 and after["notebooks"] == "08_training_run"
        assert not after["user_module"] and after["installed_module"]  # the user's code imported again, not yaml
        assert after["peak"] < before["peak"] - 250 * 2**20  # this diagnosis' peak, not the previous one's
        assert after["planted_variable"] is None and after["home"] == home  # the environment as the kernel began
        assert not after["last_error"] and after["execution_count"] == 1  # cells numbered as in a fresh kernel


@SLOW
def test_a_kept_kernel_about_to_wait_gives_the_model_and_its_memory_back_now():
    """A Ray worker's kernel between tasks: the namespace and the shared model the last diagnosis held are released
    as the task ends (Ray gives the task's memory to others), in the same process."""
    resident = "int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) * 1024"
    with Kernel(warm_up=False) as kernel:
        kernel.begin_diagnosis(["00_saved_files"], "plain")
        # torch imported first, as in a diagnosis (freeing the shared model imports it otherwise)
        plant = ("import torch\nheld = bytearray(200 * 2**20)\nheld[::4096] = b'x' * len(held[::4096])\n"
                 "from workbench.model import shared\nshared._SHARED['model'] = bytearray(200 * 2**20)\n"
                 "shared._SHARED['model'][::4096] = b'x' * len(shared._SHARED['model'][::4096])")
        before = kernel._run_quietly(plant, 120, expressions={"rss": resident, "pid": "__import__('os').getpid()"})
        assert before and before["status"] == "ok", before
        assert kernel.release_the_model()
        after = kernel._run_quietly("from workbench.model import shared", 60, expressions={
            "rss": resident, "pid": "__import__('os').getpid()", "held": "'held' in globals()",
            "shared": "len(shared._SHARED)"})
        values = {k: eval(v["data"]["text/plain"]) for k, v in after["user_expressions"].items()}  # noqa: S307
        rss_before = eval(before["user_expressions"]["rss"]["data"]["text/plain"])  # noqa: S307
        assert values["pid"] == eval(before["user_expressions"]["pid"]["data"]["text/plain"])  # noqa: S307
        assert not values["held"] and values["shared"] == 0
        assert values["rss"] < rss_before - 350 * 2**20, (rss_before, values["rss"])


@SLOW
def test_a_kernel_whose_peak_cannot_be_reset_is_replaced_by_a_fresh_one(tmp_path):
    with Kernel(warm_up=False) as kernel:
        kernel.begin_diagnosis(["00_saved_files"], "plain")
        first = state_of(kernel)["pid"]
        reply = kernel._run_quietly("import workbench.peak_memory as p\np.CLEAR_REFS = '/proc/self/no-such-file'", 60)
        assert reply and reply["status"] == "ok", reply
        kernel.begin_diagnosis(["00_saved_files"], "plain")
        assert not kernel.alive() and kernel.started == 0  # shut down: the diagnosis starts a fresh one
        assert state_of(kernel)["pid"] != first and kernel.started == 1


PEAK_AROUND_A_HELD_BUFFER = """
from workbench.peak_memory import peak_rss_bytes, reset_peak_rss
held = bytearray(200 * 2**20)
held[::4096] = b"x" * len(held[::4096])
peak = peak_rss_bytes()
del held
print(peak, reset_peak_rss(), peak_rss_bytes())
"""


def test_the_peak_is_read_and_reset_in_a_process_of_its_own():
    """In a fresh interpreter (a test worker's heap may already hold freed pages that a buffer reuses, so neither
    its peak nor its resident size would move): 200 MB touched raise the peak, and the reset brings it back down."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", PEAK_AROUND_A_HELD_BUFFER], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=60)
    assert run.returncode == 0, run.stderr
    peak, reset, after = run.stdout.split()
    assert reset == "True" and int(after) < int(peak) - 150 * 2**20 and int(peak) > 200 * 2**20


def test_a_user_module_beside_the_workbench_is_still_the_users(tmp_path, monkeypatch):
    """Only the workbench's own files and installed packages are kept imported: a `workbench_recipes.py` in the
    checkout's folder (whose path starts with the package's) is the user's."""
    import sys
    import types
    from pathlib import Path

    from workbench.report import kernel_reset

    beside = Path(kernel_reset.__file__).resolve().parents[2] / "workbench_recipes.py"
    for name, path in (("workbench_recipes", beside), ("json_like", Path(sys.prefix) / "lib" / "json_like.py"),
                       ("workbench_inside", Path(kernel_reset.__file__))):
        module = types.ModuleType(name)
        module.__file__ = str(path)
        monkeypatch.setitem(sys.modules, name, module)
    for setup in ("workbench_recipes:load", "json_like:load", "workbench_inside:load"):
        kernel_reset._forget_user_module(setup)
    assert "workbench_recipes" not in sys.modules
    assert "json_like" in sys.modules and "workbench_inside" in sys.modules


@SLOW
def test_a_kept_kernel_killed_mid_diagnosis_leaves_the_next_notebook_a_fresh_one(demo, tmp_path, contract_notebook):
    """The second diagnosis in a kept kernel: its first notebook kills the kernel, so its second runs in a fresh one
    and says so, as `diagnose` would; the cost block counts that kernel beside the kept one."""
    import json

    import nbformat

    from workbench.model.target import resolve_target
    from workbench.report.runner import diagnose, start_kernel

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nbformat.write(contract_notebook("import os\nos._exit(3)", ["dead.check"]), notebooks / "01_dies.ipynb")
    nbformat.write(contract_notebook("x = 1", []), notebooks / "02_after.ipynb")
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    nbformat.write(contract_notebook("x = 1", []), healthy / "01_fine.ipynb")
    target = resolve_target(str(demo.llama))
    kernel = start_kernel()
    try:
        reports = []
        for i, folder in enumerate((healthy, notebooks)):
            kernel.begin_diagnosis([p.stem for p in sorted(folder.glob("*.ipynb"))], "plain")
            out, _ = diagnose(target, reports_dir=tmp_path / f"reports{i}", notebook_dir=folder,
                              echo=lambda line: None, kernel=kernel, keep_kernel=True)
            reports.append(json.loads((out / "findings.json").read_text()))
    finally:
        kernel.close()
    first, second = reports
    assert first["cost"]["kernels_started"] == 1 and not first["cost"]["kernel_kept"]
    assert [(n["status"], n["kernel"]) for n in second["notebooks"]] == [("error", "shared"), ("ok", "fresh")]
    assert second["cost"]["kernels_started"] == 1 and second["cost"]["kernel_kept"]


def test_a_worker_whose_kernel_cannot_start_leaves_its_members_kernels_of_their_own(monkeypatch):
    """A pool initializer that raises breaks the pool for every member: a worker whose kernel cannot start keeps
    none, and its members are diagnosed as `diagnose` does, each in a kernel it starts."""
    from workbench.report import runner
    from workbench.sweep import local_engine

    def refuse(only=None):
        raise OSError("no kernel here")

    given = []
    monkeypatch.setattr(runner, "start_kernel", refuse)
    monkeypatch.setattr(local_engine, "_WORKER_KERNEL", None)
    monkeypatch.setattr(local_engine, "diagnose_member", lambda *args, kept_kernel: given.append(kept_kernel))
    local_engine._start_worker_kernel(["00_saved_files"])  # the pool's initializer: no exception, no kernel
    local_engine._diagnose_in_worker(None, None, None)
    assert local_engine._WORKER_KERNEL is None and given == [None]


@SLOW
def test_a_quiet_request_queued_behind_a_failing_cell_is_sent_again():
    """ipykernel aborts the requests queued behind a cell that fails (stop_on_error): the reset or the target's
    check, sent as a member's notebook fails, would come back "aborted" without running; it is sent again."""
    from jupyter_client.blocking import BlockingKernelClient

    with Kernel(warm_up=False) as kernel:
        notebook = BlockingKernelClient()
        notebook.load_connection_info(kernel.manager().get_connection_info())
        notebook.start_channels(iopub=False, stdin=False, hb=False, control=False)
        try:
            assert kernel._run_quietly("", 60) is not None  # the kernel up and idle: what follows is queued
            failing = notebook.execute("import time\ntime.sleep(2)\n1 / 0", stop_on_error=True)
            queued = notebook.execute("6 * 7")  # queued behind it, as a request of ours would be
            reply = kernel._run_quietly("", 60, expressions={"answer": "6 * 7"})
            replies = {}
            while len(replies) < 2:
                message = notebook.get_shell_msg(timeout=60)
                replies[message["parent_header"]["msg_id"]] = message["content"]["status"]
        finally:
            notebook.stop_channels()
    assert replies == {failing: "error", queued: "aborted"}  # what ipykernel does to a request queued behind it
    assert reply["status"] == "ok" and reply["user_expressions"]["answer"]["data"]["text/plain"] == "42"


def test_on_a_gpu_each_devices_cache_and_peak_are_reset_and_without_a_cuda_context_none_is_made(monkeypatch):
    """No GPU here: torch's CUDA calls are recorded, not made, to check what the reset asks: the allocator's cache
    once, each device's peak by its index, and no `torch.cuda.device` switch (which would make a context on a GPU
    the kernel never used). A kernel that never made a CUDA context gets none made by the reset."""
    import torch

    from workbench.report import kernel_reset

    kernel_reset._reset_cuda_memory()
    assert not torch.cuda.is_initialized()
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device", lambda index: calls.append(("device", index)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("peak", device)))
    kernel_reset._reset_cuda_memory()
    assert calls == ["empty_cache", ("peak", 0), ("peak", 1)]


PEAK_OF_A_STEP = """
from workbench.peak_memory import peak_rss_bytes, step_peak_rss
held = bytearray(300 * 2**20)
held[::4096] = b"x" * len(held[::4096])
del held
process_peak = peak_rss_bytes()
with step_peak_rss() as step:
    small = bytearray(50 * 2**20)
    small[::4096] = b"x" * len(small[::4096])
print(step[0], process_peak, peak_rss_bytes())
"""


def test_a_steps_peak_is_its_own_and_the_process_keeps_its_peak():
    """In a fresh interpreter: a step that touches 50 MB after the process held 300 MB reads its own peak (under
    the process' peak), and the process' peak after the step is still the 300 MB one."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", PEAK_OF_A_STEP], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=60)
    assert run.returncode == 0, run.stderr
    step, process_peak, after = map(int, run.stdout.split())
    assert step < process_peak - 200 * 2**20 and after >= process_peak > 300 * 2**20


def test_a_step_where_the_peak_cannot_be_restarted_reads_none(monkeypatch):
    import workbench.peak_memory as peak_memory

    monkeypatch.setattr(peak_memory, "CLEAR_REFS", "/proc/self/no-such-file")
    before = peak_memory.peak_rss_bytes()
    with peak_memory.step_peak_rss() as step:
        pass
    assert step == [None] and peak_memory.peak_rss_bytes() >= before
