"""`make bench`: the cost of a diagnosis, each number against the naive way, measured in the same run.

    .venv/bin/python bench/run.py [--repeats 5] [--diagnose-runs 2] [--skip-naive-7b] [--skip-memory]
    .venv/bin/python bench/run.py --only-explain [--heldout DIR]     # and the other --only-* modes (--help)

Every timed step runs in a fresh Python process (imports warm in the OS cache, then measured in-process with
perf_counter; peak memory is that process's ru_maxrss), so one measurement's allocations never hide another's.
Prints a markdown table (min / median / max over the runs) and writes it to bench/RESULTS.md, stamped with the
date, the machine and the commit (`bench/results.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# tiny checkpoints of the census (outside the demo's families): a causal LM with MoE, a VLM, speech, an encoder
TINY_ARCHITECTURES = ["qwen3_moe", "paligemma", "whisper", "deberta-v2"]

PRELUDE = """
import json, resource, sys, time
from workbench.runtime import quiet_and_offline; quiet_and_offline()
import torch, transformers, workbench
"""


def measure(body: str, repeats: int) -> list[dict]:
    """Run `body` (which sets `result = {...}` and may use `start`) in fresh processes; seconds and peak RSS."""
    code = PRELUDE + "start = time.perf_counter()\n" + body + """
result['seconds'] = time.perf_counter() - start
result['peak_rss'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print('RESULT ' + json.dumps(result))
"""
    out = []
    for _ in range(repeats):
        proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=1800)
        line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"benchmark step failed:\n{proc.stderr[-2000:]}")
        out.append(json.loads(line[7:]))
    return out


def stats(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    fmt = (lambda x: f"{x:.3f}") if unit == "s" else (lambda x: f"{x:.0f}")
    return f"{fmt(min(v))} / {fmt(statistics.median(v))} / {fmt(max(v))} {unit}"


def row(rows: list, what: str, ours: list[dict], naive: list[dict] | None, note: str = "") -> None:
    ratio = (statistics.median(r["seconds"] for r in naive) / statistics.median(r["seconds"] for r in ours)
             if naive else None)
    rows.append((what, stats([r["seconds"] for r in ours]),
                 stats([r["seconds"] for r in naive]) if naive else "—",
                 f"{ratio:.0f}× faster" if ratio and ratio >= 10 else f"{ratio:.1f}× faster" if ratio else "—",
                 note))


HEADER_CENSUS = """
from workbench.model.loading import auto_config, model_class_for
model_class_for(auto_config(FOLDER))  # transformers' lazy import of the model module, outside the clock
from workbench.model.target import resolve_target
from workbench.probes.dtype.headers import checkpoint_probe
start = time.perf_counter()
report = checkpoint_probe(resolve_target(FOLDER))
result = {'bytes_read': sum(c.bytes_read for c in report.censuses), 'tensors': sum(len(h.tensors) for i in report.inspections for h in i.headers)}
"""

NAIVE_LOADED_CENSUS = """
from workbench.model.loading import auto_config, model_class_for
model_class_for(auto_config(FOLDER))  # transformers' lazy import of the model module, outside the clock
from collections import Counter
from workbench.model.loading import load_pretrained
start = time.perf_counter()
model = load_pretrained(FOLDER)
counts = Counter((str(p.dtype)) for p in model.parameters())
result = {'tensors': sum(counts.values())}
"""

NAIVE_READ_ALL = """
from workbench.model.loading import auto_config, model_class_for
model_class_for(auto_config(FOLDER))  # transformers' lazy import of the model module, outside the clock
from collections import Counter
from pathlib import Path
from safetensors.torch import load_file
start = time.perf_counter()
counts, read = Counter(), 0
for shard in sorted(Path(FOLDER).glob('*.safetensors')):
    tensors = load_file(str(shard))
    counts.update(str(t.dtype) for t in tensors.values())
    read += shard.stat().st_size
    del tensors
result = {'tensors': sum(counts.values()), 'bytes_read': read}
"""

LINEAGE_SAMPLED = """
from workbench.model.checkpoint import inspect_checkpoint
from workbench.probes.evaluation.lineage import sampled_fingerprints
start = time.perf_counter()
prints = sampled_fingerprints(inspect_checkpoint(FOLDER))
result = {'tensors': len(prints)}
"""

NAIVE_HASH_ALL = """
import hashlib
from pathlib import Path
start = time.perf_counter()
digests = {}
for shard in sorted(Path(FOLDER).glob('*.safetensors')):
    h = hashlib.blake2b(digest_size=12)
    with open(shard, 'rb') as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    digests[shard.name] = h.hexdigest()
result = {'files': len(digests)}
"""

PREDICTED = """
from workbench.model.loading import auto_config, model_class_for
model_class_for(auto_config(FOLDER))  # transformers' lazy import of the model module, outside the clock
from workbench.probes.dtype.census import predicted_quantized_census
from workbench.model.loading import auto_config
start = time.perf_counter()
census = predicted_quantized_census(auto_config(FOLDER), '4bit')
result = {'tensors': sum(r['tensors'] for r in census.rows)}
"""

REAL_4BIT = """
from workbench.model.loading import auto_config, model_class_for
model_class_for(auto_config(FOLDER))  # transformers' lazy import of the model module, outside the clock
from workbench.probes.dtype.census import dtype_census
from workbench.model.loading import load_pretrained
start = time.perf_counter()
census = dtype_census(load_pretrained(FOLDER, quant='4bit'))
result = {'tensors': sum(r['tensors'] for r in census.rows)}
"""

TRACER = """
from workbench.model.inputs import sample_inputs
from workbench.model.loading import load_pretrained
from workbench.model.tracer import DtypeTracer
torch.set_num_threads(1)
model = load_pretrained(FOLDER).eval()
inputs, _ = sample_inputs(model, FOLDER)
def fwd():
    with torch.no_grad():
        model(**inputs)
fwd()
tracer = DtypeTracer(model)
plain, traced = [], []
for _ in range(60):
    t = time.perf_counter(); fwd(); plain.append(time.perf_counter() - t)
    with tracer:
        fwd(); t = time.perf_counter(); fwd(); traced.append(time.perf_counter() - t); tracer.calls.clear()
import statistics
start = time.perf_counter()
result = {'plain': statistics.median(plain), 'traced': statistics.median(traced)}
"""


def process_seconds(argv: list[str], repeats: int, env: dict | None = None,
                    before_each=None) -> list[dict]:
    """Wall-clock seconds of whole processes (start-up and imports included: what a user waits for)."""
    out = []
    for _ in range(repeats):
        if before_each:
            before_each()
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})})
        seconds = time.perf_counter() - start
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{argv} failed:\n{proc.stderr[-2000:]}")
        out.append({"seconds": seconds})
    return out


# the naive start-up: torch, transformers and pandas imported with workbench, as an eager package would
EAGER_HELP = "import torch, transformers, pandas; from workbench.cli import main; main(['--help'])"


DIAGNOSE_CPU = """
import resource, sys
from pathlib import Path
from workbench.cli import main
if STACK_HERE:  # the check that needs torch and transformers made in this process, as before the kernel made it
    from workbench.model.target import check_with_the_stack
    check_with_the_stack("plain", Path(FOLDER))
rc = main(["diagnose", FOLDER, "--notebooks", "01", "--reports-dir", REPORTS])
usage = resource.getrusage(resource.RUSAGE_SELF)
print("CPU", usage.ru_utime + usage.ru_stime, "torch" in sys.modules, rc)
"""


def diagnose_cpu(folder: Path, reports: Path, repeats: int, stack_here: bool) -> list[dict]:
    """CPU seconds of the `diagnose` process itself (its kernel apart), in fresh processes."""
    code = (DIAGNOSE_CPU.replace("STACK_HERE", str(stack_here)).replace("FOLDER", repr(str(folder)))
            .replace("REPORTS", repr(str(reports))))
    out = []
    for _ in range(repeats):
        proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                              stdin=subprocess.DEVNULL)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("CPU ")), None)
        if line is None or not line.endswith(" 0"):
            raise RuntimeError(f"diagnose failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        _, cpu, torch_imported, _ = line.split()
        out.append({"seconds": float(cpu), "torch": torch_imported == "True"})
    return out


def startup_rows(rows: list, sparse: Path, repeats: int, cache: Path, tiny: Path | None = None) -> None:
    """`--help` and the header census of a 7B-shaped checkpoint, as process times; with `tiny`, the CPU the
    `diagnose` process itself spends on it."""
    import shutil

    help_ours = process_seconds([PY, "-m", "workbench", "--help"], repeats)
    help_eager = process_seconds([PY, "-c", EAGER_HELP], repeats)
    row(rows, "`python -m workbench --help` as a process (light import vs torch + transformers imported)",
        help_ours, help_eager, "goal < 0.5 s")
    env = {"WORKBENCH_CACHE": str(cache)}
    census = [PY, "-m", "workbench", "census", str(sparse)]
    cold = process_seconds(census, max(1, repeats // 2), env, before_each=lambda: shutil.rmtree(cache, True))
    warm = process_seconds(census, repeats, env)
    row(rows, "`python -m workbench census` of the 7B-shaped checkpoint as a process (header map cached vs "
              "first census of this config: meta skeleton built)", warm, cold,
        "goal < 1 s; the cache is keyed by config.json, the tensor names and the transformers release")
    if tiny is not None:
        ours = diagnose_cpu(tiny, cache / "reports", repeats, stack_here=False)
        naive = diagnose_cpu(tiny, cache / "reports", repeats, stack_here=True)
        row(rows, "CPU of the `diagnose` process itself, the demo's tiny Llama, notebook 01 (the set-up and the "
                  "architecture checked in the kernel vs in this process: torch and transformers imported here "
                  "too)", ours, naive,
            f"CPU seconds, the kernel's apart; torch imported by ours: {ours[0]['torch']}")


SAVED_FILES = """
from workbench.model.loading import auto_config, model_class_for
model_class_for(auto_config(BASE))  # transformers' lazy import of the model module, outside the clock
import peft, safetensors  # noqa: F401 - library imports, outside the clock
from workbench.catalog import notebook
from workbench.model.target import resolve_target
from workbench.recorder import FindingsRecorder
import tempfile
target = resolve_target(FOLDER)
rec = FindingsRecorder(tempfile.mktemp(suffix='.json'), notebook='00_saved_files')
steps = notebook('00_saved_files').steps
start = time.perf_counter()
results = {}
for step in steps:
    results[step.name] = rec.run(step.function(), *[target if a == 'target' else results[a] for a in step.args])
files = results['files']
result = {'bytes_read': files.bytes_read, 'verdicts': {f.id: f.verdict for f in rec.findings}}
"""


def with_folder(body: str, folder: Path) -> str:
    return body.replace("FOLDER", repr(str(folder)))


def diagnose_runs(runs: int, jobs: int, reports: Path) -> list[dict]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([PY, "-m", "workbench", "diagnose", "--jobs", str(jobs), "--reports-dir", str(reports)],
                              capture_output=True, text=True, cwd=ROOT, timeout=1800)
        seconds = time.perf_counter() - start
        folder = Path(proc.stdout.strip().splitlines()[-1].removeprefix("report: "))
        report = json.loads((folder / "findings.json").read_text())
        out.append({"seconds": seconds, "notebooks": {n["name"]: n["seconds"] for n in report["notebooks"]},
                    "folder": str(folder)})
    return out


def kernel_and_export(report_folder: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds to start the workbench kernel and run one trivial cell; seconds to export one notebook's HTML."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from workbench.report.html_export import export_html

    starts, exports = [], []
    with tempfile.TemporaryDirectory() as tmp:
        nb = new_notebook(cells=[new_code_cell("import workbench")])
        nb.metadata["kernelspec"] = {"name": "workbench", "display_name": "workbench", "language": "python"}
        path = Path(tmp) / "empty.ipynb"
        nbformat.write(nb, path)
        import papermill as pm

        for _ in range(repeats):
            t = time.perf_counter()
            pm.execute_notebook(str(path), str(Path(tmp) / "out.ipynb"), kernel_name="workbench",
                                progress_bar=False, log_output=False)
            starts.append(time.perf_counter() - t)
        executed = sorted(report_folder.glob("0*.ipynb"))
        for _ in range(repeats):
            t = time.perf_counter()
            for nb_path in executed:
                export_html(nb_path, Path(tmp) / "x.html")
            exports.append((time.perf_counter() - t) / max(len(executed), 1))
    return starts, exports


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _rss(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of one process."""
    anon = file = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("RssFile:"):
                file = int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, file


def sampled_peak(cmd: list[str]) -> dict:
    """Run cmd, sampling every process under it every 0.1 s: the largest anonymous RSS of any one process, the
    largest sum over all of them, and the file-backed (mmapped checkpoint, shared libraries) part beside it."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    peak_one = peak_sum = peak_file = 0
    while proc.poll() is None:
        sizes = [_rss(pid) for pid in _descendants(proc.pid)]
        peak_one = max([peak_one] + [a for a, _ in sizes])
        peak_sum = max(peak_sum, sum(a for a, _ in sizes))
        peak_file = max([peak_file] + [f for _, f in sizes])
        time.sleep(0.1)
    return {"anon_one": peak_one, "anon_sum": peak_sum, "file_one": peak_file,
            "seconds": time.perf_counter() - start}


# Llama shapes of about 0.4, 1.3, 2.6 and 5.0 GB in bf16 (random weights): how a diagnosis' cost grows with size
SCALING_SHAPES = {
    "0.4 GB": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16),
    "1.3 GB": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16),
    "2.6 GB": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=26, num_attention_heads=16),
    # twice the depth again: where the curve goes past the three sizes, every weight real
    "5.0 GB": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=52, num_attention_heads=16),
}
LOAD_AND_FORWARD = """
import sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
with torch.no_grad():
    model(torch.arange(16).unsqueeze(0))
"""


def write_llama(folder: Path, shape: dict) -> Path:
    if not (folder / "config.json").exists():
        code = ("import sys, torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\ntorch.manual_seed(0)\n"
                f"config = LlamaConfig(**{shape!r}, num_key_value_heads=4, vocab_size=32000, "
                "tie_word_embeddings=False, dtype='bfloat16')\n"
                "LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])\n")
        subprocess.run([PY, "-c", code, str(folder)], check=True, cwd=ROOT, timeout=1800, stdin=subprocess.DEVNULL)
        # written back to disk before anything is timed: the kernel writes a fresh checkpoint's dirty pages back
        # over the next seconds, on the disk the timed runs read from (a 2.6 GB one slowed the naive runs to 6.8 s)
        os.sync()
    return folder


def scaling_rows(rows: list, workdir: Path, repeats: int, sizes: list[str] | None = None) -> str:
    """diagnose ÷ (a fresh process that loads the checkpoint and runs one forward), per size; peak memory of the
    diagnosis ÷ checkpoint bytes; model loads per diagnosis. Returns the curve fitted over the Llama sizes
    (`fitted_curve`), empty where fewer than two ran."""
    medians = []  # (GB, ours, naive): the fit's points
    for label, shape in SCALING_SHAPES.items():
        if sizes and label.split()[0] not in sizes:
            continue
        ckpt = write_llama(workdir / f"llama-{label.split()[0]}", shape)
        size = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
        reports = workdir / f"reports-{label.split()[0]}"
        diagnose = [PY, "-m", "workbench", "diagnose", str(ckpt), "--reports-dir", str(reports)]
        # the two ways in turn, run by run: this host's speed swings by 15 % within an hour, and a block of one
        # way's runs after the other's would put the swing into the ratio
        naive, runs, sampled = [], [], None
        for _ in range(repeats):
            naive += process_seconds([PY, "-c", LOAD_AND_FORWARD, str(ckpt)], 1)
            if sampled is None:
                sampled = sampled_peak(diagnose)
                runs.append({"seconds": sampled["seconds"]})
            else:
                runs += process_seconds(diagnose, 1)
        report = json.loads(sorted(reports.glob("*/*/findings.json"))[-1].read_text())
        ratio = statistics.median(r["seconds"] for r in runs) / statistics.median(r["seconds"] for r in naive)
        medians.append((size / 1e9, statistics.median(r["seconds"] for r in runs),
                        statistics.median(r["seconds"] for r in naive)))
        rows.append((f"`diagnose` of a {size / 1e9:.2f} GB Llama (every notebook) vs load + one forward in a fresh "
                     "process", stats([r["seconds"] for r in runs]), stats([r["seconds"] for r in naive]),
                     f"{ratio:.1f}× the load + forward",
                     f"{report['cost']['model_loads']} model load(s), {report['cost']['kernels_started']} kernel, "
                     f"{forwards_of(report['cost'])}; "
                     f"peak anonymous RSS of one process {sampled['anon_one'] / size:.2f}× the checkpoint; "
                     f"slowest steps (last run): {slowest_steps(report['cost'])}; goal ≤ 2× (issue 38)"))
    if not sizes or "cold" in sizes:
        cold_cache_row(rows, workdir, repeats)
    if not sizes or "7b" in sizes:
        sparse_7b_row(rows, workdir)
    return fitted_curve(medians)


def fitted_curve(medians: list[tuple[float, float, float]]) -> str:
    """Each way's seconds as a fixed part plus seconds per GB (least squares over the sizes' medians), and the ratio
    the slopes tend to: where the ratio goes as the checkpoint grows on this host. Empty for fewer than two sizes."""
    if len(medians) < 2:
        return ""
    sizes = [gb for gb, _, _ in medians]

    def fit(values: list[float]) -> tuple[float, float]:
        slope = statistics.covariance(sizes, values) / statistics.variance(sizes)
        return statistics.fmean(values) - slope * statistics.fmean(sizes), slope

    (ours_fixed, ours_slope), (naive_fixed, naive_slope) = fit([m[1] for m in medians]), fit([m[2] for m in medians])
    return (f"Fitted over the {len(medians)} Llama sizes (least squares on the medians): a diagnosis takes "
            f"{ours_fixed:.1f} s + {ours_slope:.2f} s/GB, the load + forward {naive_fixed:.1f} s + "
            f"{naive_slope:.2f} s/GB. The fixed parts are mostly each process' imports of the stack (the diagnosis' "
            "kernel imports peft, bitsandbytes and the Trainer too, and runs ten notebooks). Per GB, the load + "
            "forward reads the weights once, in its forward (the load maps them); a diagnosis reads them in its four "
            "forwards (eval and train, with autocast and without, each run once and shared) and its one backward "
            "(which also writes every gradient and reads it for its norm). On this CPU those reads are the size-bound "
            f"cost, so the ratio tends to {ours_slope / naive_slope:.1f}× as the checkpoint grows (the slopes' ratio).")


LOAD_AND_FORWARD_VLM = LOAD_AND_FORWARD.replace("AutoModelForCausalLM", "AutoModelForImageTextToText")
LOW_MEMORY = 1.5 * 2**30  # the watchdog's floor of MemAvailable: below it the diagnosis is stopped, not OOM-killed


def _available() -> int:
    from workbench.model.memory import host_available_bytes

    return host_available_bytes()[0]


def watched(cmd: list[str], log: Path) -> dict:
    """Run cmd in its own process group, its output to `log`; stop the whole group when the host's available memory
    falls under LOW_MEMORY (the kernel's OOM killer would pick its victim among every process here)."""
    import signal

    start, lowest, stopped = time.perf_counter(), _available(), False
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        while proc.poll() is None:
            lowest = min(lowest, _available())
            if lowest < LOW_MEMORY:
                stopped = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.2)
    return {"seconds": time.perf_counter() - start, "stopped": stopped, "lowest_available": lowest,
            "returncode": proc.returncode, "output": log.read_text(errors="replace")}


def sparse_7b_row(rows: list, workdir: Path) -> None:
    """The 7B-shaped sparse checkpoint (bench/sparse_checkpoint.py: Qwen2-VL-7B's shape) with the values a model
    that trains needs written into its holes (`rows_every=64`: the embeddings whole, every 64th row of each matrix,
    every norm 1; with every weight 0 a diagnosis fails grad.flow and spends its time explaining the zeros)
    diagnosed with every notebook under `watched`, against load + one forward: how far it gets on this host, each
    notebook's seconds, and where and why it stopped when it did."""
    import re

    from sparse_checkpoint import write_sparse_checkpoint

    ckpt = write_sparse_checkpoint(workdir / "sparse-7b-rows", rows_every=64)
    on_disk = sum(p.stat().st_blocks * 512 for p in ckpt.glob("*.safetensors"))
    apparent = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    # the naive way before the diagnosis and after it, the page cache filled by an untimed one first, as the other
    # sizes' runs find it: a first read of the freshly written checkpoint took 17.6 s, the one after the diagnosis
    # 8.4 s (and with every weight a hole, 30.5 s in one run and 19.9 s in the next)
    process_seconds([PY, "-c", LOAD_AND_FORWARD_VLM, str(ckpt)], 1)
    naive = process_seconds([PY, "-c", LOAD_AND_FORWARD_VLM, str(ckpt)], 1)
    run = watched([PY, "-m", "workbench", "diagnose", str(ckpt), "--reports-dir", str(workdir / "reports-7b")],
                  workdir / "diagnose-7b.log")
    naive += process_seconds([PY, "-c", LOAD_AND_FORWARD_VLM, str(ckpt)], 1)
    done = re.findall(r"\[\d+/\d+\] (\d\d)_\w+ \w+ \(([\d.]+) s\)", run["output"])
    started = re.findall(r"\[\d+/\d+\] (\d\d)_\w+ \.\.\.", run["output"])
    per = ", ".join(f"{nb} {float(sec):.1f} s" for nb, sec in done)
    if run["stopped"]:
        where = started[-1] if started else "start-up"
        verdict = "stopped"
        note = (f"stopped in notebook {where} after {run['seconds']:.0f} s, when this host had under "
                f"{LOW_MEMORY / 2**30:.1f} GiB available (lowest {run['lowest_available'] / 2**30:.1f} GiB); "
                f"notebooks done before it: {per or 'none'}")
    else:
        verdict = f"{run['seconds'] / statistics.median(r['seconds'] for r in naive):.1f}× the load + forward"
        note = (f"exit {run['returncode']}; per notebook: {per}; the load + forward before the diagnosis "
                f"{naive[0]['seconds']:.1f} s, after it {naive[1]['seconds']:.1f} s")
    rows.append((f"`diagnose` of the 7B-shaped sparse checkpoint ({apparent / 1e9:.1f} GB apparent, Qwen2-VL-7B's "
                 f"shape; {on_disk / 1e9:.1f} GB of it data: the embeddings whole, every 64th row of each matrix, "
                 "every norm 1) vs load + one forward in a fresh process",
                 stats([run["seconds"]]), stats([r["seconds"] for r in naive]), verdict, note))


# `diagnose` as the CLI runs it, its read-ahead of the weights (workbench.model.prefetch) switched off: the naive way
DIAGNOSE_WITHOUT_PREFETCH = """
import sys, workbench.diagnose_command as command
command._prefetch_weights = lambda *args: None
from workbench.cli import main
sys.exit(main(['diagnose', *sys.argv[1:]]))
"""


def cold_cache_row(rows: list, workdir: Path, repeats: int) -> None:
    """The 2.6 GB Llama diagnosed from a cold page cache, with the weights read ahead while the fresh kernel imports
    (ours) and without (naive), in turn: whole seconds, and the load's own seconds from the report's cost block."""
    from workbench.model.prefetch import drop_from_page_cache

    ckpt = write_llama(workdir / "llama-2.6", SCALING_SHAPES["2.6 GB"])
    shards = sorted(ckpt.glob("*.safetensors"))
    size = sum(p.stat().st_size for p in shards)
    reports = workdir / "reports-cold"
    runs: dict[str, list[dict]] = {"ours": [], "naive": []}
    for _ in range(repeats):
        for way, argv in (("ours", [PY, "-m", "workbench", "diagnose"]),
                          ("naive", [PY, "-c", DIAGNOSE_WITHOUT_PREFETCH])):
            drop_from_page_cache(shards)
            run = process_seconds([*argv, str(ckpt), "--reports-dir", str(reports)], 1)[0]
            report = json.loads(max(reports.glob("*/*/findings.json"), key=lambda p: p.stat().st_mtime).read_text())
            run["load"] = sum(load["seconds"] or 0 for load in report["cost"]["loads"])
            runs[way].append(run)
    ratio = statistics.median(r["seconds"] for r in runs["ours"]) / statistics.median(r["seconds"] for r in runs["naive"])
    rows.append((f"`diagnose` of the {size / 1e9:.2f} GB Llama from a cold page cache (evicted before each run): the "
                 "weights read ahead while the fresh kernel imports vs not", stats([r["seconds"] for r in runs["ours"]]),
                 stats([r["seconds"] for r in runs["naive"]]), f"{ratio:.2f}× the time without",
                 "the load's own seconds (cost block): "
                 f"{stats([r['load'] for r in runs['ours']])} read ahead, {stats([r['load'] for r in runs['naive']])} "
                 "not; the two ways run in turn"))


def slowest_steps(cost: dict, n: int = 4) -> str:
    """The report's `n` slowest probe steps, "notebook/step seconds" each (its cost block's `steps`)."""
    steps = sorted(cost.get("steps") or [], key=lambda s: -s["seconds"])[:n]
    return ", ".join(f"{s['notebook'][:2]}/{s['step']} {s['seconds']:.1f} s"
                     + (f" ({s['forwards']} forward{'s' * (s['forwards'] != 1)})" if s.get("forwards") else "")
                     + (f" peak {s['peak_rss_bytes'] / 2**30:.1f} GiB" if s.get("peak_rss_bytes") else "")
                     for s in steps) or "not recorded"


def forwards_of(cost: dict) -> str:
    """The full-model forwards of a diagnosis (its cost block's steps), and how many ran with autograd."""
    steps = cost.get("steps") or []
    total, with_grad = sum(s.get("forwards", 0) for s in steps), sum(s.get("forwards_with_grad", 0) for s in steps)
    return f"{total} full-model forwards ({with_grad} with autograd)"


def memory_of_a_diagnosis(workdir: Path) -> dict:
    """Peak anonymous memory of a diagnosis of a ~0.4 GB checkpoint (one notebook at a time) against an idle
    kernel with the stack imported: the model's own copies, not the page cache of the mmapped weights."""
    make = f"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                     num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, dtype='bfloat16')
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained({str(workdir / 'llama-0.4b')!r})
start = time.perf_counter(); result = {{}}
"""
    measure(make, 1)
    ckpt = workdir / "llama-0.4b"
    ckpt_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    idle = sampled_peak([PY, "-c", PRELUDE + "time.sleep(2)"])
    run = sampled_peak([PY, "-m", "workbench", "diagnose", str(ckpt), "--jobs", "1",
                        "--reports-dir", str(workdir / "reports")])
    return {"checkpoint_bytes": ckpt_bytes, "idle": idle["anon_one"], **run,
            "ratio": (run["anon_one"] - idle["anon_one"]) / ckpt_bytes}


DATA_PATH = """
import datasets
from pathlib import Path
from trl import SFTConfig
from trl.trainer.sft_trainer import SFTTrainer
from workbench.demo.chat_data import write_chat_data
from workbench.model.target import resolve_target
from workbench.probes.data.batches import data_path_probe
from workbench.probes.data.stats import data_statistics_probe
from workbench.probes.data.template import template_probe
datasets.disable_caching(); datasets.disable_progress_bars()
import os; os.environ['WORKBENCH_BATCH'] = '1'
small = write_chat_data(Path(TMP) / 'small.jsonl', rows=200)
data = write_chat_data(Path(TMP) / 'chat.jsonl', rows=ROWS)

def trl_preparation(path):
    # what SFTTrainer.__init__ runs on a train_dataset: load it, then trl's own _prepare_dataset (max_length 1024)
    probe = data_path_probe(resolve_target(FOLDER, data=str(path)))
    state = type('State', (), {})()
    state._tokenizer, state.chat_template, state.completion_only_loss = probe.tokenizer, None, False
    args = SFTConfig(output_dir=TMP, report_to=[], use_cpu=True, bf16=False)
    t = time.perf_counter()
    prepared = SFTTrainer._prepare_dataset(state, datasets.Dataset.from_json(str(path)), probe.tokenizer, args,
                                           False, None, 'train')
    assert len(prepared) == ROWS or path == small
    return time.perf_counter() - t

def data_path(path):
    # notebook 07 without the token view: the streamed statistics and the template check
    t = time.perf_counter()
    probe = data_path_probe(resolve_target(FOLDER, data=str(path)))
    stats = data_statistics_probe(probe)
    template_probe(probe, stats)
    assert stats.rows == ROWS or path == small
    return time.perf_counter() - t

trl_preparation(small); data_path(small)  # imports and first-call costs outside the clock
trl, ours = [], []
for _ in range(2):
    trl.append(trl_preparation(data)); ours.append(data_path(data))
result = {'trl': trl, 'ours': ours, 'rows': ROWS}
"""


def data_path_row(rows: list, folder: Path, tmp: Path, n_rows: int) -> None:
    """Notebook 07's whole-dataset pass against trl's own dataset preparation on the same rows, same process."""
    body = DATA_PATH.replace("FOLDER", repr(str(folder))).replace("TMP", repr(str(tmp))).replace("ROWS", str(n_rows))
    out = measure(body, 1)[0]
    ratio = statistics.median(out["ours"]) / statistics.median(out["trl"])
    rows.append((f"data path (notebook 07) on {n_rows:,} chat rows vs trl's dataset preparation, same process",
                 stats(out["ours"]), stats(out["trl"]), f"{ratio:.2f}× trl's time",
                 "goal ≤ 2×; streamed: every row, labels after the collator, EOS, truncation, template"))


RUN_LOG = """
import math, types
from pathlib import Path
from workbench.probes.run.log_probe import judge_run
from workbench.probes.run.run_facts import run_facts
from workbench.probes.run.trainer_state import read_training_log
run = Path(TMP) / 'run-log'
run.mkdir(exist_ok=True)
(run / 'config.json').write_text(json.dumps({'architectures': ['LlamaForCausalLM'], 'vocab_size': 32000}))
history = []
for step in range(1, ENTRIES + 1):
    history.append({'epoch': step / 5000, 'grad_norm': 1.0 + (step % 7) / 10, 'learning_rate': 2e-4 * min(1, step / 100),
                    'loss': 10.4 * math.exp(-step / 20000) + 0.5, 'step': step})
    if step % 1000 == 0:
        history.append({'epoch': step / 5000, 'eval_loss': 10.4 * math.exp(-step / 20000) + 0.6, 'step': step})
history = history[:ENTRIES]
(run / 'trainer_state.json').write_text(json.dumps({'global_step': ENTRIES, 'max_steps': ENTRIES, 'logging_steps': 1,
                                                    'epoch': ENTRIES / 5000, 'log_history': history}))
target = types.SimpleNamespace(model_dir=run, allow_pickle=False, run=None, checkpoint=str(run))
start = time.perf_counter()
facts = run_facts(run, target)
log = read_training_log(facts.state_path)
findings, marks = judge_run(log, facts)
result = {'entries': log.entries + len(log.eval_step), 'verdicts': sorted({f.verdict for f in findings})}
"""


def run_log_row(rows: list, tmp: Path, entries: int, repeats: int) -> None:
    """run.loss/gradients/schedule/eval (notebook 08) on a trainer_state.json of `entries` log entries; then a GRPO
    run's log of as many entries (trl 1.16's keys) read and judged by every run check, against reading it into a
    pandas DataFrame (what a notebook does first)."""
    body = RUN_LOG.replace("TMP", repr(str(tmp))).replace("ENTRIES", str(entries))
    out = measure(body, repeats)
    rows.append((f"trainer_state.json of {out[0]['entries']:,} log entries read and judged (run.loss, run.gradients, "
                 "run.schedule, run.eval)", stats([r["seconds"] for r in out]), "—", "—",
                 f"goal < 2 s; verdicts {', '.join(out[0]['verdicts'])}"))
    grpo = GRPO_LOG.replace("TMP", repr(str(tmp))).replace("ENTRIES", str(entries))
    ours = measure(grpo + GRPO_JUDGED, repeats)
    naive = measure(grpo + GRPO_DATAFRAME, repeats)
    row(rows, f"a GRPO run's trainer_state.json of {ours[0]['entries']:,} log entries ({ours[0]['megabytes']:.0f} MB, "
              "trl 1.16's keys) read and judged by every run check, against json + pandas.DataFrame alone", ours, naive,
        f"goal < 2 s; {ours[0]['trainer']}; verdicts {', '.join(ours[0]['verdicts'])}")


GRPO_LOG = """
import math, types
from pathlib import Path
run = Path(TMP) / 'grpo-log'
run.mkdir(exist_ok=True)
(run / 'config.json').write_text(json.dumps({'architectures': ['Qwen2ForCausalLM'], 'vocab_size': 151936}))
keys = ['clip_ratio/high_max', 'clip_ratio/high_mean', 'clip_ratio/low_mean', 'clip_ratio/low_min',
        'clip_ratio/region_mean', 'completions/clipped_ratio', 'completions/max_length',
        'completions/max_terminated_length', 'completions/mean_length', 'completions/mean_terminated_length',
        'completions/min_length', 'completions/min_terminated_length', 'entropy', 'frac_reward_zero_std', 'kl',
        'num_tokens', 'reward', 'reward_std', 'rewards/accuracy/mean', 'rewards/accuracy/std', 'step_time']
history = []
for step in range(1, ENTRIES + 1):
    entry = {k: (step % 97) / 97 for k in keys}
    entry.update({'epoch': step / 5000, 'grad_norm': 0.5 + (step % 7) / 10, 'learning_rate': 1e-6, 'loss': 1e-3 * (step % 5),
                  'frac_reward_zero_std': 0.2, 'completions/clipped_ratio': 0.02, 'entropy': 0.6, 'kl': 0.01,
                  'reward': 0.3 + 0.4 * step / ENTRIES, 'step': step})
    history.append(entry)
state = {'global_step': ENTRIES, 'max_steps': ENTRIES, 'logging_steps': 1, 'epoch': ENTRIES / 5000,
         'log_history': history}
(run / 'trainer_state.json').write_text(json.dumps(state, indent=2, sort_keys=True) + '\\n')  # as TrainerState writes
(run / 'README.md').write_text('---\\ntags:\\n- trl\\n- grpo\\n---\\n')
megabytes = (run / 'trainer_state.json').stat().st_size / 1e6
del history, state
"""

GRPO_JUDGED = """
from workbench.probes.run.log_probe import training_log_probe
from workbench.probes.run.trl_signals import run_signals_probe
target = types.SimpleNamespace(model_dir=run, allow_pickle=False, run=None, checkpoint=str(run))
start = time.perf_counter()
logged = training_log_probe(run, target)
signals = run_signals_probe(logged)
verdicts = sorted({f.verdict for f in logged.findings() + signals.findings()})
result = {'entries': logged.log.entries, 'megabytes': megabytes, 'trainer': logged.facts.kind.name, 'verdicts': verdicts}
"""

GRPO_DATAFRAME = """
import pandas
start = time.perf_counter()
frame = pandas.DataFrame(json.loads((run / 'trainer_state.json').read_text())['log_history'])
result = {'entries': len(frame)}
"""


def tiny_architecture_rows(rows: list, tmp: Path, model_types: list[str]) -> None:
    """`workbench diagnose` (every notebook, one kernel) on the census's tiny checkpoint of each model type."""
    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import architectures

    by_type = {a.model_type: a for a in architectures()}
    for model_type in model_types:
        folder = build_tiny_checkpoint(by_type[model_type], tmp / "tiny")
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "workbench", "diagnose", str(folder), "--reports-dir",
                               str(tmp / "tiny-reports")], stdin=subprocess.DEVNULL, capture_output=True, text=True)
        seconds = time.monotonic() - start
        rows.append((f"`workbench diagnose` on the census's tiny {model_type} ({by_type[model_type].class_name}), "
                     "every notebook", f"{seconds:.1f} s", "—", "—", f"goal ≤ 15 s; exit {proc.returncode}"))


def census_rows(rows: list, out: Path) -> None:
    """The whole architecture census (`python -m workbench families --out OUT`), timed: wall, and per record."""
    start = time.monotonic()
    written = out / "families.json"
    before = written.stat().st_mtime if written.exists() else 0.0
    proc = subprocess.run([sys.executable, "-m", "workbench", "families", "--out", str(out)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1) or not written.exists() or written.stat().st_mtime <= before:
        raise SystemExit(f"the census did not complete (exit {proc.returncode}): {proc.stderr[-2000:]}")
    report_ = json.loads(written.read_text())
    seconds = sorted(r["seconds"] for r in report_["records"] if r.get("seconds") is not None)
    summary = report_["summary"]
    rows.append((f"the architecture census: {summary['architectures']} model types × plain, qlora (one worker per "
                 "set-up)", f"{wall / 60:.1f} min", "—", "—",
                 f"goal ≤ 60 min on 2 cores; per record median {statistics.median(seconds):.1f} s, max "
                 f"{seconds[-1]:.0f} s; {summary['built']} built ({summary['built_share']:.0%}), clean "
                 + ", ".join(f"{k} {v}" for k, v in summary["clean"].items())))


FSDP_REPLAY = """
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
from workbench.model.setups import PreparedModel
from workbench.probes.train.configuration import TrainingConfiguration
from workbench.probes.train.fsdp_units import fsdp_units_probe
config = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                     num_attention_heads=64, num_key_value_heads=8)
with torch.device("meta"):
    model = LlamaForCausalLM(config).to(torch.bfloat16)
fsdp = {"version": 1, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
args = TrainingArguments(TMP, report_to=[], fsdp=True, fsdp_config=fsdp)
start = time.perf_counter()
(found,) = fsdp_units_probe(PreparedModel(model, None, "t", "70B"), None,
                            TrainingConfiguration("bench", args, given={"fsdp": True, "fsdp_config": fsdp})).findings()
result = {"verdict": found.verdict, "units": found.evidence["unit_count"]}
"""

SERVE_FILES = """
from workbench.model.target import resolve_target
from workbench.probes.serve.adapter_rules import serve_adapter_probe
target = resolve_target(FOLDER)
start = time.perf_counter()
found = serve_adapter_probe(target).findings()[0]
result = {"verdict": found.verdict}
"""

CALLBACK_TEXT = """
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments
from workbench.demo.chat_data import chat_rows
from workbench.integrations import WorkbenchCallback
PREIMPORT
t = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(FOLDER)  # the load a training script makes: the first, in this process
load = time.perf_counter() - t
tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
rows = Dataset.from_list([{'input_ids': list(tokenizer.apply_chat_template(r['messages'], tokenize=True,
                          return_dict=True)['input_ids'])} for r in chat_rows(ROWS)])
callback = WorkbenchCallback()
args = TrainingArguments(output_dir=TMP, per_device_train_batch_size=8, max_steps=1, report_to=[], use_cpu=True,
                         disable_tqdm=True, save_strategy='no', logging_steps=1)
trainer = Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), callbacks=[callback])
"""

# the demo's own stage 2 (docs/demo.md): its LoRA, trainable, on Qwen2-VL stage 1 loaded in 4-bit (QLoRA), trained on
# grounding rows (an image, a question, a box) through a collator that concatenates the images' patches
CALLBACK_DEMO_QLORA = """
from peft import PeftModel, prepare_model_for_kbit_training
from transformers import BitsAndBytesConfig, Qwen2VLForConditionalGeneration, Trainer, TrainingArguments
from workbench.integrations import WorkbenchCallback
from workbench.model.inputs import load_vlm_parts
from workbench.model.vlm_batches import collate_teacher_forced, teacher_forced_inputs
from workbench.tasks.grounding import read_dataset, write_dataset
PREIMPORT
tokenizer, image_processor = load_vlm_parts(FOLDER)
items = [teacher_forced_inputs(tokenizer, image_processor, r.image, r.question, r.answer)
         for r in read_dataset(write_dataset(TMP + '/grounding', ROWS))]
quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.bfloat16)
t = time.perf_counter()
model = Qwen2VLForConditionalGeneration.from_pretrained(FOLDER, quantization_config=quant)
load = time.perf_counter() - t
model = PeftModel.from_pretrained(prepare_model_for_kbit_training(model), ADAPTER, is_trainable=True)
callback = WorkbenchCallback()
args = TrainingArguments(output_dir=TMP + '/out', per_device_train_batch_size=4, max_steps=1, report_to=[],
                         use_cpu=True, bf16=True, disable_tqdm=True, save_strategy='no', logging_steps=1,
                         remove_unused_columns=False)
trainer = Trainer(model=model, args=args, train_dataset=items, processing_class=tokenizer,
                  data_collator=lambda rows: collate_teacher_forced(rows, tokenizer.pad_token_id), callbacks=[callback])
"""

CALLBACK_TRAIN = """
t = time.perf_counter()
trainer.train()
train = time.perf_counter() - t
report = json.loads((callback.report_folder / 'findings.json').read_text())
result = {'preflight': callback.preflight_seconds, 'load': load, 'train': train,
          'findings': len(report['findings']),
          'verdicts': sorted({f['verdict'] for f in report['findings']}),
          'notebooks': {n['name'][:2]: n['seconds'] for n in report['notebooks'] if n['name'] != '08_training_run'}}
"""

# the pre-flight's checks with their modules imported before the clock: what is left once Python has loaded the
# workbench's code (a second Trainer in the same process, a notebook kernel)
PREIMPORT = """
from workbench.catalog import notebook
from workbench.integrations.preflight import PREFLIGHT_NOTEBOOKS
for name in PREFLIGHT_NOTEBOOKS:
    for step in notebook(name).steps:
        step.function()
import workbench.report.runner, workbench.report.index_page, workbench.probes.train.configuration
"""


def compile_workbench() -> None:
    """Byte-compile the package, as installing its wheel does: the pre-flight imports its checks' modules, and an
    environment with PYTHONDONTWRITEBYTECODE would otherwise compile them from source in every run."""
    import compileall

    compileall.compile_dir(str(ROOT / "workbench"), quiet=1)


def callback_row(rows: list, body: str, tmp: Path, repeats: int, what: str, **values: str | int) -> None:
    """WorkbenchCallback's pre-flight on a Trainer against one load of its model, in the same fresh process, first
    of each (goal: the pre-flight under one load's time); then the pre-flight with its modules imported beforehand."""
    def filled(preimport: bool) -> str:
        text = body.replace("PREIMPORT", PREIMPORT if preimport else "") + CALLBACK_TRAIN
        for key, value in values.items():
            text = text.replace(key, repr(str(value)) if isinstance(value, (str, Path)) else str(value))
        return text.replace("TMP", repr(str(tmp)))

    out = measure(filled(False), repeats)
    warm = measure(filled(True), repeats)
    preflight, load = [r["preflight"] for r in out], [r["load"] for r in out]
    ratio = statistics.median(preflight) / statistics.median(load)
    parts = {k: statistics.median(r["notebooks"][k] for r in out) for k in out[0]["notebooks"]}
    rows.append((f"WorkbenchCallback pre-flight on a Trainer of {what}, against one load of that model", stats(preflight), stats(load), f"{ratio:.2f}× one load",
                 "goal < 1× one load; by notebook " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
                 + f" s; with the workbench's modules already imported "
                 f"{statistics.median(r['preflight'] for r in warm):.3f} s; {out[0]['findings']} findings "
                 f"({'/'.join(out[0]['verdicts'])}); one training step "
                 f"{statistics.median(r['train'] - r['preflight'] for r in out):.2f} s"))


def step_and_serve_rows(rows: list, tmp: Path, adapter: Path, repeats: int) -> None:
    """Notebook 09's FSDP replay on a 70B-shaped Llama (meta device) and notebook 10's files part on a 7B-shaped
    adapter: what the issues ask to stay under 5 s and 1 s."""
    replay = measure(FSDP_REPLAY.replace("TMP", repr(str(tmp / "out"))), repeats)
    rows.append(("train.fsdp_units: torch's FSDP1 wrap walk replayed on a 70B-shaped Llama (meta device, 80 layers)",
                 stats([r["seconds"] for r in replay]), "—", "—",
                 f"goal < 5 s; {replay[0]['units']} units, verdict {replay[0]['verdict']}; a real wrap needs the GPUs"))
    serve = measure(SERVE_FILES.replace("FOLDER", repr(str(adapter))), repeats)
    rows.append(("serve.adapter: four engines' rules on a 7B-shaped rank-8 q/v adapter (files only)",
                 stats([r["seconds"] for r in serve]), "—", "—", f"goal < 1 s; verdict {serve[0]['verdict']}"))


def table(rows: list) -> str:
    lines = ["| what | ours (min / median / max) | naive (min / median / max) | ratio | notes |", "|---|---|---|---|---|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def write_section(mode: str, title: str, body: str) -> None:
    from results import write_section as write  # bench/ is on sys.path (main)

    write(mode, title, body)


def report(mode: str, title: str, rows: list, after: str = "") -> None:
    """Print the table and write it to bench/RESULTS.md (its own section, stamped)."""
    body = table(rows) + (f"\n\n{after}" if after else "")
    print("\n" + body)
    write_section(mode, title, body)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--diagnose-runs", type=int, default=2)
    parser.add_argument("--skip-naive-7b", action="store_true", help="skip reading all 16.6 GB (slow)")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--only-memory", action="store_true", help="just the memory measurement")
    parser.add_argument("--only-startup", action="store_true",
                        help="just --help and census as processes, and the CPU of the diagnose process itself")
    parser.add_argument("--only-scaling", action="store_true",
                        help="just diagnose vs load + forward on 0.4 / 1.3 / 2.6 / 5.0 GB checkpoints and the 7B-shaped sparse one")
    parser.add_argument("--sizes", nargs="*", help="with --only-scaling: some of 0.4 1.3 2.6 5.0 cold 7b (cold: the 2.6 "
                        "GB one from a cold page cache, read ahead and not; 7b: the 7B-shaped sparse checkpoint)")
    parser.add_argument("--only-cold-cache", action="store_true",
                        help="just the 2.6 GB diagnosis from a cold page cache, the weights read ahead and not")
    parser.add_argument("--only-data", action="store_true", help="just the data path against trl's preparation")
    parser.add_argument("--data-rows", type=int, default=20_000)
    parser.add_argument("--only-run-log", action="store_true", help="just notebook 08's log checks on a long log")
    parser.add_argument("--log-entries", type=int, default=200_000)
    parser.add_argument("--only-step-and-serve", action="store_true",
                        help="just notebook 09's FSDP replay (70B-shaped) and notebook 10's files part (7B-shaped)")
    parser.add_argument("--only-architectures", action="store_true",
                        help="just `diagnose` on tiny checkpoints of a few model types outside the demo")
    parser.add_argument("--only-callback", action="store_true",
                        help="just WorkbenchCallback's pre-flight against one model load")
    parser.add_argument("--only-explain", action="store_true",
                        help="just `workbench explain`: a traceback, a 100 MB log, --ckpt against diagnose")
    parser.add_argument("--heldout", metavar="DIR", help="with --only-explain: score the held-out corpus in DIR "
                        "(cases/NNN.txt and labels.jsonl, kept outside the project)")
    parser.add_argument("--only-plan", action="store_true",
                        help="just `workbench plan`: planned vs a real Trainer step on four set-ups, a 70B-shaped plan")
    parser.add_argument("--only-plan-fork", action="store_true",
                        help="just the plan's real step forked from a kernel server against a fresh process")
    parser.add_argument("--only-sweep", action="store_true",
                        help="just workbench sweep: 8 members local, --jobs 2 and on Ray (bench/sweep_bench.py)")
    parser.add_argument("--only-glibc-trace", action="store_true",
                        help="just what glibc keeps resident in a CPU LoRA step: heaptrack's trace replayed four "
                        "ways (bench/glibc_trace.py; needs heaptrack)")
    parser.add_argument("--only-census", metavar="OUT",
                        help="just the whole architecture census, timed (about 25 min; families.md/json go to OUT)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from sparse_checkpoint import write_adapter, write_sparse_checkpoint

    from workbench.demo.build import build_demo

    demo = build_demo()
    rows: list[tuple] = []
    if args.only_memory:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            memory = memory_of_a_diagnosis(Path(tmp))
        print(json.dumps(memory, indent=1))
        write_section("memory", "Memory of a diagnosis", memory_text(memory))
        return
    if args.only_scaling:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            curve = scaling_rows(rows, Path(tmp), args.repeats, args.sizes)
        report("scaling", "A diagnosis against one load + forward, by checkpoint size", rows, curve)
        return
    if args.only_cold_cache:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            cold_cache_row(rows, Path(tmp), args.repeats)
        report("cold-cache", "A diagnosis from a cold page cache", rows)
        return
    if args.only_data:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            data_path_row(rows, demo.llama, Path(tmp), args.data_rows)
        report("data", "The data path against trl's own preparation", rows)
        return
    if args.only_run_log:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            run_log_row(rows, Path(tmp), args.log_entries, args.repeats)
        report("run-log", "A training run's log (notebook 08)", rows)
        return
    if args.only_step_and_serve:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            sparse = write_sparse_checkpoint(Path(tmp) / "sparse-7b")
            step_and_serve_rows(rows, Path(tmp), write_adapter(sparse, Path(tmp) / "sparse-7b-lora"), args.repeats)
        report("step-and-serve", "The training step and serving checks on large shapes", rows)
        return
    if args.only_architectures:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            tiny_architecture_rows(rows, Path(tmp), TINY_ARCHITECTURES)
        report("architectures", "A diagnosis of a tiny architecture outside the demo", rows)
        return
    if args.only_callback:
        compile_workbench()
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            tmp = Path(tmp)
            callback_row(rows, CALLBACK_DEMO_QLORA, tmp, args.repeats,
                         "the demo's stage 2 (its LoRA on Qwen2-VL stage 1 in 4-bit, 16 grounding rows with images)",
                         FOLDER=demo.qwen_stage1, ADAPTER=demo.qwen_stage2, ROWS=16)
            callback_row(rows, CALLBACK_TEXT, tmp, args.repeats, "the demo's text model (bf16, 200 chat rows)",
                         FOLDER=demo.llama, TOKENIZER=demo.llama, ROWS=200)
            label, shape = next(iter(SCALING_SHAPES.items()))
            callback_row(rows, CALLBACK_TEXT, tmp, args.repeats, f"a {label} Llama (bf16, 200 chat rows)",
                         FOLDER=write_llama(tmp / "llama", shape), TOKENIZER=demo.llama, ROWS=200)
        report("callback", "The training callback's pre-flight", rows)
        return
    if args.only_explain:
        from explain_bench import explain_rows

        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            note = explain_rows(rows, Path(tmp), args.repeats, demo, Path(args.heldout) if args.heldout else None,
                                row, stats)
        report("explain", "`workbench explain`: the text alone, a long log, and --ckpt", rows, note)
        return
    if args.only_plan:
        from plan_bench import family_rows, measured_rows, plan_70b_seconds

        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            lines, _records = measured_rows(Path(tmp))
            families = family_rows(Path(tmp))
            seventy = plan_70b_seconds(Path(tmp), max(1, args.repeats // 2))
        row(rows, "`workbench plan` of a 70B-shaped Llama, QLoRA + gradient checkpointing, batch 1 × 2048, against "
                  "an H100 (a process: imports, the meta build, the 2- and 4-layer steps)",
            [{"seconds": s} for s in seventy], None, "goal: seconds; no weight read")
        note = ("Planned against measured, MiB above the loaded weights (a real `transformers.Trainer`, two steps, "
                "this CPU, a fresh process; the default malloc's two runs, min–max; errors: plan vs the "
                "fixed-threshold run / vs the default runs' mean). `workbench plan --device cpu` measures glibc's "
                "line by a real step of its own (random weights); `--no-heap-measure` replays the planned "
                "tensors instead:\n\n"
                "| set-up (90M Qwen2) | real, glibc default | real, MALLOC_MMAP_THRESHOLD_=131072 | planned tensors | "
                "planned (glibc measured) | planned (glibc replayed) | accelerate's 4× rule | plan time (measured / "
                "replayed) |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(lines)
                + "\n\nOther families, built from configs (6 layers, hidden 512, random weights; LoRA r8 on each "
                "family's own projections, batch 4 × 512), `workbench plan --device cpu` against two real "
                "default-malloc steps (min–max; errors against their mean):\n\n"
                "| family | real, glibc default | planned | planned tensors | plan time |\n|---|---|---|---|---|\n"
                + "\n".join(families))
        report("plan", "`workbench plan`: planned against a real Trainer step", rows, note)
        return
    if args.only_plan_fork:
        from plan_bench import forked_step_rows

        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            forked, fresh, note = forked_step_rows(Path(tmp), max(2, args.repeats // 2))
        row(rows, "the plan's real step (`workbench plan --device cpu`'s malloc measurement), 90M Qwen2 + LoRA r16, "
                  "batch 4 × 256: forked from a kernel server (a sweep's, `diagnose --jobs`') vs a fresh process",
            forked, fresh, note)
        report("plan-fork", "The plan's real step where a kernel server runs", rows,
               "The forked step imports nothing (the server did); what it measures is the step's resident rise, "
               "which must not differ from a fresh process's (`workbench/plan/host_heap.py`).")
        return
    if args.only_sweep:
        from sweep_bench import sweep_rows

        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            table_text = sweep_rows(Path(tmp), max(1, args.repeats // 5))
        print("\n" + table_text)
        write_section("sweep", "`workbench sweep`: eight members, local against --jobs 2 against Ray", table_text
                      + "\n\nEach member is `diagnose --notebooks 00` on a checkpoint of a real LoRA run. The local "
                      "engine keeps one kernel for its members in series (each worker one with --jobs 2), reset "
                      "between them; each Ray worker keeps one for the members it runs, and Ray's row includes "
                      "starting its local cluster. The naive row runs `diagnose` once per checkpoint (a process and a kernel each).")
        return
    if args.only_glibc_trace:
        from glibc_trace import MISSING_TOOLS, glibc_trace_rows

        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            table_text = glibc_trace_rows(Path(tmp))
        if table_text is None:  # the section keeps its last measurement
            print(f"--only-glibc-trace skipped: {MISSING_TOOLS}")
            return
        print("\n" + table_text)
        write_section("glibc-trace", "What glibc keeps resident in a CPU LoRA step (heaptrack, replayed)", table_text
                      + "\n\nThe plan bench's LoRA r16, batch 8 × 512 of a 90M Qwen2, a real `transformers.Trainer` "
                      "under `heaptrack --raw`; its every allocation replayed through glibc's policy (bench/glibc_trace.py"
                      "). The plan's tracker sees the first row's allocations only.")
        return
    if args.only_census:
        census_rows(rows, Path(args.only_census))
        report("census", "The architecture census (make families)", rows)
        return
    if args.only_startup:
        with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
            startup_rows(rows, write_sparse_checkpoint(Path(tmp) / "sparse-7b"), args.repeats, Path(tmp) / "cache",
                         demo.llama)
        report("startup", "Start-up of the command line", rows)
        return
    with tempfile.TemporaryDirectory(prefix="workbench-bench-") as tmp:
        tmp = Path(tmp)
        sparse = write_sparse_checkpoint(tmp / "sparse-7b")
        apparent = sum(p.stat().st_size for p in sparse.iterdir())
        startup_rows(rows, sparse, args.repeats, tmp / "cache", demo.llama)

        ours = measure(with_folder(HEADER_CENSUS, demo.qwen_stage1), args.repeats)
        naive = measure(with_folder(NAIVE_LOADED_CENSUS, demo.qwen_stage1), args.repeats)
        row(rows, "census, demo Qwen2-VL (headers vs from_pretrained + count)", ours, naive,
            f"{ours[0]['bytes_read']:,} header bytes read")
        ours7 = measure(with_folder(HEADER_CENSUS, sparse), args.repeats)
        naive7 = None if args.skip_naive_7b else measure(with_folder(NAIVE_READ_ALL, sparse), 1)
        row(rows, f"census, 7B-shaped sparse checkpoint ({apparent / 1e9:.1f} GB apparent; naive: read every "
                  "shard)", ours7, naive7,
            f"{ours7[0]['bytes_read']:,} bytes read vs {apparent:,}; peak RSS "
            f"{statistics.median(r['peak_rss'] for r in ours7) / 1e6:.0f} MB"
            + (f" vs {statistics.median(r['peak_rss'] for r in naive7) / 1e6:.0f} MB" if naive7 else ""))

        sampled7 = measure(with_folder(LINEAGE_SAMPLED, sparse), args.repeats)
        hashed7 = None if args.skip_naive_7b else measure(with_folder(NAIVE_HASH_ALL, sparse), 1)
        row(rows, "which components differ between two bases (adapter.base_model), 7B-shaped: sampled bytes per "
                  "tensor vs hashing every byte", sampled7, hashed7,
            f"{sampled7[0]['tensors']} tensors, 8 KiB read per tensor")

        adapter7 = write_adapter(sparse, tmp / "sparse-7b-lora")
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # so every check runs
            (sparse / name).write_bytes((demo.qwen_base / name).read_bytes())
        (sparse / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "pad_token_id": 0}))
        saved7 = measure(with_folder(SAVED_FILES, adapter7).replace("BASE", repr(str(sparse))), args.repeats)
        read = saved7[0]["bytes_read"]
        adapter_bytes = read.get("adapter tensors", 0)
        row(rows, "notebook 00 (what the saved files say), 7B-shaped sparse checkpoint + a rank-8 q/v LoRA: every "
                  "probe (the demo's tokenizer beside it, so every check runs)", saved7, None,
            f"{sum(read.values()) - adapter_bytes:,} bytes read of the base and configs "
            f"({', '.join(f'{k} {v:,}' for k, v in read.items() if k != 'adapter tensors')}), plus the adapter's "
            f"{adapter_bytes:,} bytes of values (its norms need every element); goal < 2 s")

        pred = measure(with_folder(PREDICTED, demo.qwen_stage1), args.repeats)
        real = measure(with_folder(REAL_4BIT, demo.qwen_stage1), args.repeats)
        row(rows, "4-bit census, demo (meta prediction vs real bitsandbytes load)", pred, real,
            f"peak RSS {statistics.median(r['peak_rss'] for r in pred) / 1e6:.0f} MB vs "
            f"{statistics.median(r['peak_rss'] for r in real) / 1e6:.0f} MB")
        pred7 = measure(with_folder(PREDICTED, sparse), args.repeats)
        row(rows, "4-bit census, 7B-shaped (meta prediction; a real load would read 16.6 GB)", pred7, None,
            f"peak RSS {statistics.median(r['peak_rss'] for r in pred7) / 1e6:.0f} MB, no weight read")

        for label, folder in (("Qwen2-VL", demo.qwen_base), ("Llama", demo.llama)):
            tr = measure(with_folder(TRACER, folder), max(1, args.repeats // 2))
            ratios = [r["traced"] / r["plain"] for r in tr]
            rows.append((f"dtype tracer on a forward, demo {label} (traced / plain)",
                         stats([r["traced"] for r in tr], "ms", 1000), stats([r["plain"] for r in tr], "ms", 1000),
                         f"{statistics.median(ratios):.2f}× the plain forward", "goal ≤ 1.5×"))

        data_path_row(rows, demo.llama, tmp, args.data_rows)
        run_log_row(rows, tmp, args.log_entries, args.repeats)
        step_and_serve_rows(rows, tmp, adapter7, args.repeats)
        serial = diagnose_runs(args.diagnose_runs, 1, tmp / "r1")
        side = diagnose_runs(args.diagnose_runs, 2, tmp / "r2")
        per_nb = {name: statistics.median(r["notebooks"][name] for r in serial) for name in serial[0]["notebooks"]}
        starts, exports = kernel_and_export(Path(serial[0]["folder"]), 3)
        rows.append(("`diagnose` on the demo: one kernel for every notebook, the model shared (ours) vs a kernel "
                     "per notebook, two side by side",
                     stats([r["seconds"] for r in serial]), stats([r["seconds"] for r in side]),
                     f"{statistics.median(r['seconds'] for r in side) / statistics.median(r['seconds'] for r in serial):.2f}× faster",
                     "per notebook (shared kernel): " + ", ".join(f"{k[:2]} {v:.1f} s" for k, v in per_nb.items())
                     + f"; starting a kernel {statistics.median(starts):.1f} s, HTML export "
                       f"{statistics.median(exports):.1f} s per notebook; goal ≤ 40 s"))
        curve = scaling_rows(rows, tmp, max(1, args.repeats // 2))
        memory = None if args.skip_memory else memory_of_a_diagnosis(tmp)

    report("full", f"Every cost against the naive way (--repeats {args.repeats})", rows,
           "\n\n".join(text for text in (curve, memory_text(memory) if memory else "") if text))


def memory_text(memory: dict) -> str:
    return (f"Memory of a diagnosis of a {memory['checkpoint_bytes'] / 1e9:.2f} GB checkpoint (one notebook at a "
            f"time), sampled every 0.1 s: largest anonymous RSS of one process {memory['anon_one'] / 1e9:.2f} GB, "
            f"an idle process with the stack imported {memory['idle'] / 1e9:.2f} GB: (peak - idle) / checkpoint = "
            f"{memory['ratio']:.2f}× (goal ≤ 1.5×). All processes together: {memory['anon_sum'] / 1e9:.2f} GB "
            f"anonymous; file-backed pages (the mmapped weights, libraries) up to {memory['file_one'] / 1e9:.2f} GB "
            "in one process, reclaimable page cache.")


if __name__ == "__main__":
    main()
