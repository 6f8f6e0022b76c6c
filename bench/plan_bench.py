"""`make bench` rows of `workbench plan` (bench/run.py --only-plan): planned against measured, with the peers' rule.

For four set-ups of a 90M-parameter Qwen2 (built from its config, random weights; none of them tuned to): a full
fine-tune, LoRA, LoRA with gradient checkpointing, LoRA with a trainable head at a long sequence. Each is measured as
a real `transformers.Trainer` runs two steps on this CPU in a fresh process (`workbench.plan.real_step`: resident
memory above the loaded model), with glibc's default malloc (twice: it varies from run to run) and with
`MALLOC_MMAP_THRESHOLD_=131072` (no dynamic threshold: resident memory follows the live tensors), and planned with
`workbench plan --device cpu` (glibc's line measured by its own real step) and with `--no-heap-measure` (replayed). The peers' rule
is `accelerate estimate-memory`'s: training with Adam takes 4× the model's size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MIB = 2**20
REAL_RUNS = 2  # real steps with the default malloc per set-up: its resident peak varies from run to run

LORA = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
SETUPS = [  # (name, TrainingArguments fields, adapter config or None, seq)
    ("full fine-tune, batch 4 × 256", {"per_device_train_batch_size": 4}, None, 256),
    ("LoRA r16, batch 8 × 512", {"per_device_train_batch_size": 8}, LORA, 512),
    ("LoRA r16 + gradient checkpointing, batch 8 × 512",
     {"per_device_train_batch_size": 8, "gradient_checkpointing": True}, LORA, 512),
    ("LoRA r16 + trainable lm_head, batch 2 × 1024", {"per_device_train_batch_size": 2},
     {**LORA, "modules_to_save": ["lm_head"]}, 1024),
]


def write_model(folder: Path) -> Path:
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=2, vocab_size=32000, architectures=["Qwen2ForCausalLM"], dtype="float32",
                tie_word_embeddings=False).save_pretrained(folder)
    return folder


def _json(argv: list[str], env: dict | None = None) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if proc.returncode not in (0, 1) or line is None:
        raise RuntimeError(f"{argv} failed:\n{proc.stderr[-2000:]}")
    return json.loads(line) if line.rstrip().endswith("}") and "\n" not in line else json.loads(proc.stdout)


def _plan(model: Path, args_file: Path, extra: list[str], seq: int, *flags: str) -> tuple[dict, float]:
    start = time.perf_counter()
    proc = subprocess.run([PY, "-m", "workbench", "plan", str(model), "--training-args", str(args_file),
                           *(["--peft", extra[0]] if extra else []), "--seq", str(seq), "--device", "cpu",
                           "--quick", "--json", *flags], capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          stdin=subprocess.DEVNULL)
    return json.loads(proc.stdout), time.perf_counter() - start


def measured_rows(tmp: Path) -> tuple[list[str], list[dict]]:
    model = write_model(tmp / "qwen2-90m")
    lines, records = [], []
    for name, args, adapter, seq in SETUPS:
        extra = []
        if adapter:
            path = tmp / f"adapter-{len(records)}.json"
            path.write_text(json.dumps(adapter))
            extra = [str(path)]
        real_cmd = [PY, "-m", "workbench.plan.real_step", str(model), json.dumps(args), *extra, "--seq", str(seq)]
        defaults = [_json(real_cmd)["above_weights_bytes"] for _ in range(REAL_RUNS)]
        default = sum(defaults) / len(defaults)
        fixed = _json(real_cmd, {"MALLOC_MMAP_THRESHOLD_": "131072"})["above_weights_bytes"]
        args_file = tmp / f"args-{len(records)}.json"
        args_file.write_text(json.dumps(args))
        plan, seconds = _plan(model, args_file, extra, seq)
        replayed, replay_seconds = _plan(model, args_file, extra, seq, "--no-heap-measure")
        tensors = plan["tensor_peak_bytes"] - plan["weights_bytes"]
        with_heap = plan["peak_bytes"] - plan["weights_bytes"]
        with_replay = replayed["peak_bytes"] - replayed["weights_bytes"]
        rule = 3 * plan["weights_bytes"]  # accelerate: 4x the model for Adam, i.e. 3x above the weights
        record = {"setup": name, "real_default": defaults, "real_fixed_threshold": fixed, "plan_tensors": tensors,
                  "plan_glibc_measured": with_heap, "plan_glibc_replayed": with_replay, "accelerate_rule": rule,
                  "plan_seconds": seconds, "plan_replayed_seconds": replay_seconds}
        records.append(record)

        def err(x: int, ref: float) -> str:
            return f"{(x - ref) / ref:+.0%}"

        lines.append(f"| {name} | {min(defaults) / MIB:,.0f}–{max(defaults) / MIB:,.0f} | {fixed / MIB:,.0f} | "
                     f"{tensors / MIB:,.0f} ({err(tensors, fixed)} / {err(tensors, default)}) | "
                     f"**{with_heap / MIB:,.0f} ({err(with_heap, default)})** | "
                     f"{with_replay / MIB:,.0f} ({err(with_replay, default)}) | {rule / MIB:,.0f} "
                     f"({err(rule, default)}) | {seconds:.1f} s / {replay_seconds:.1f} s |")
    return lines, records


# other families, built from configs (6 layers, hidden 512; random weights), LoRA r8 on their own projection names,
# batch 4 × 512: the CPU plan against the mean of two real default-malloc steps
FAMILIES = {
    "Llama": ("LlamaConfig", dict(intermediate_size=1376, num_key_value_heads=4, vocab_size=32000),
              ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "GPT-2": ("GPT2Config", dict(n_embd=512, n_layer=6, n_head=8, vocab_size=50257, n_positions=1024),
              ["c_attn", "c_proj", "c_fc"]),
    "Gemma 2": ("Gemma2Config", dict(intermediate_size=1536, num_key_value_heads=4, head_dim=64, vocab_size=32000),
                ["q_proj", "v_proj", "up_proj", "down_proj"]),
    "Phi-3": ("Phi3Config", dict(intermediate_size=1536, num_key_value_heads=8, vocab_size=32064, pad_token_id=0),
              ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
}
ARCHITECTURES = {"Llama": "LlamaForCausalLM", "GPT-2": "GPT2LMHeadModel", "Gemma 2": "Gemma2ForCausalLM",
                 "Phi-3": "Phi3ForCausalLM"}


def family_rows(tmp: Path) -> list[str]:
    import transformers

    lines = []
    args = {"per_device_train_batch_size": 4}
    args_file = tmp / "args-families.json"
    args_file.write_text(json.dumps(args))
    for name, (config_class, fields, targets) in FAMILIES.items():
        shape = {} if config_class == "GPT2Config" else dict(hidden_size=512, num_hidden_layers=6,
                                                              num_attention_heads=8)
        folder = tmp / name.replace(" ", "-")
        getattr(transformers, config_class)(**shape, **fields, architectures=[ARCHITECTURES[name]],
                                            dtype="float32").save_pretrained(folder)
        adapter = tmp / f"{folder.name}-lora.json"
        adapter.write_text(json.dumps({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16,
                                       "target_modules": targets}))
        real_cmd = [PY, "-m", "workbench.plan.real_step", str(folder), json.dumps(args), str(adapter), "--seq", "512"]
        reals = [_json(real_cmd)["above_weights_bytes"] for _ in range(REAL_RUNS)]
        mean = sum(reals) / len(reals)
        plan, seconds = _plan(folder, args_file, [str(adapter)], 512)
        planned = plan["peak_bytes"] - plan["weights_bytes"]
        tensors = plan["tensor_peak_bytes"] - plan["weights_bytes"]
        lines.append(f"| {name} | {min(reals) / MIB:,.0f}–{max(reals) / MIB:,.0f} | **{planned / MIB:,.0f} "
                     f"({(planned - mean) / mean:+.1%})** | {tensors / MIB:,.0f} ({(tensors - mean) / mean:+.0%}) | "
                     f"{seconds:.1f} s |")
    return lines


def plan_70b_seconds(tmp: Path, repeats: int) -> list[float]:
    from transformers import LlamaConfig

    folder = tmp / "llama-70b-shaped"
    LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, architectures=["LlamaForCausalLM"], dtype="bfloat16",
                max_position_embeddings=8192).save_pretrained(folder)
    args = tmp / "args-70b.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 1, "gradient_checkpointing": True, "bf16": True}))
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([PY, "-m", "workbench", "plan", str(folder), "--setup", "qlora", "--training-args", str(args),
                        "--seq", "2048", "--gpu", "h100", "--quick"], capture_output=True, text=True, cwd=ROOT,
                       timeout=1800, stdin=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - start)
    return out


def forked_step_rows(tmp: Path, runs: int) -> tuple[list[dict], list[dict], str]:
    """The plan's real step (`host_heap.real_step_command`) forked from a kernel server against the same step in a
    fresh process, `runs` of each in turn, on the bench's LoRA r16 set-up at batch 4 × 256: ([{"seconds", "rise"}]
    forked, the same fresh, a note). The server is started here, in this process' environment (the offline
    settings the CLI makes), as a sweep or `diagnose --jobs` starts theirs."""
    from workbench.plan.host_heap import real_step_command
    from workbench.report.kernel_server import SERVER_ENV
    from workbench.runtime import environment_as_found, quiet_and_offline

    quiet_and_offline()
    os.environ.pop(SERVER_ENV, None)  # the fresh runs: no server of another's
    model = write_model(tmp / "model-fork")
    adapter = tmp / "adapter_config.json"
    adapter.write_text(json.dumps(LORA))
    fields, seq = {"per_device_train_batch_size": 4}, 256
    socket_path, log_path = tmp / "server.sock", tmp / "server.log"
    with open(log_path, "wb") as log:  # what it forked, or why it refused
        server = subprocess.Popen([PY, "-m", "workbench.report.kernel_server", str(socket_path)], cwd=ROOT,
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not socket_path.exists():  # bound once the server's imports are done
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the kernel server did not start")
            time.sleep(0.1)
        forked, fresh = [], []
        for _ in range(runs):
            for served, into in ((True, forked), (False, fresh)):
                # the command as the plan builds it in a process that a server serves, or in one without
                with environment_as_found({SERVER_ENV: str(socket_path)} if served else {}):
                    command = real_step_command(model, fields, [str(adapter)], seq, scratch=tmp)
                    start = time.perf_counter()
                    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1800,
                                          stdin=subprocess.DEVNULL)
                    seconds = time.perf_counter() - start
                if proc.returncode != 0:
                    raise RuntimeError(f"the real step failed:\n{proc.stderr[-2000:]}")
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                into.append({"seconds": seconds, "rise": result["above_weights_bytes"]})
    finally:
        server.terminate()
        server.wait(timeout=60)
    log = log_path.read_text(errors="replace")
    if log.count("forked workbench.plan.real_step") != runs:  # a refused step ran fresh: no comparison
        raise RuntimeError(f"the kernel server did not fork every step: {log[-2000:]}")

    def span(rows: list[dict]) -> str:
        return f"{min(r['rise'] for r in rows) / MIB:,.0f}–{max(r['rise'] for r in rows) / MIB:,.0f}"

    note = (f"resident rise above the weights, MiB: forked {span(forked)}, fresh {span(fresh)} "
            f"({runs} runs each, in turn)")
    return forked, fresh, note
