"""`python -m workbench diagnose|sweep|explain|plan|census|checks|regressions|demo`: bad input gets one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from workbench.errors import UsageError
from workbench.findings import FAILING_VERDICTS
from workbench.runtime import quiet_and_offline, skip_slow_optional_imports


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench",
                                     description="Diagnose fine-tuning failures of Hugging Face models.")
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("diagnose", help="run the diagnostic notebooks into a dated report")
    d.add_argument("checkpoint", nargs="?", help="checkpoint or adapter folder, or a hub id org/name "
                   "(default: the bundled demo)")
    d.add_argument("--checkpoint", type=int, dest="run_checkpoint", metavar="N",
                   help="CKPT is a Trainer output_dir: diagnose its checkpoint-N (default: the final save at its "
                        "root, else the latest checkpoint)")
    add_diagnose_options(d)
    d.add_argument("--jobs", type=int, default=1,
                   help="default 1: every notebook in one kernel, the model loaded once; N > 1: N notebooks side "
                        "by side, each in its own kernel with its own copy of the model; 0: choose by cores and memory")

    w = sub.add_parser("sweep", help="several checkpoints, adapters or Trainer output_dirs (or, with --history, one "
                       "output_dir's checkpoint-N folders) diagnosed side by side into one comparison report")
    w.add_argument("paths", nargs="*", metavar="PATH", help="the members: checkpoint or adapter folders, Trainer "
                   "output_dirs; with --history one output_dir")
    w.add_argument("--history", action="store_true", help="PATH is one Trainer output_dir: its checkpoint-N folders "
                   "in step order, and the first checkpoint at which each check turned bad")
    add_diagnose_options(w)
    w.add_argument("--jobs", type=int, default=1, help="members diagnosed at a time by the local engine, each in its "
                   "own process (default 1: in series)")
    w.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local (default): this machine; ray: one Ray task per member (pip install "
                        "'finetune-workbench[ray]')")
    w.add_argument("--address", metavar="HOST:PORT", help="with --engine ray: the Ray cluster to join (default: a "
                   "local cluster Ray starts)")
    w.add_argument("--shared-dir", metavar="PATH", help="with --engine ray: a folder every node sees; members write "
                   "their reports there instead of sending them back through Ray's object store")
    w.set_defaults(checkpoint=None, run_checkpoint=None)

    c = sub.add_parser("census", help="dtype census from safetensors headers alone (no weight is read)")
    c.add_argument("checkpoint", help="a checkpoint folder, or a hub id org/name (headers read over HTTP)")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.add_argument("--trust-remote-code", action="store_true")

    k = sub.add_parser("checks", help="the check catalog: every check, its notebook, question and verdicts")
    k.add_argument("--json", action="store_true", help="the catalog as JSON (for tools)")
    k.add_argument("--markdown", action="store_true", help="the catalog as the README's markdown table")
    k.add_argument("--where", metavar="ID", help="where a check lives: its probe's file:line, result class, tests")

    m = sub.add_parser("demo", help="build the bundled demo checkpoints and print their paths")
    m.add_argument("--force", action="store_true", help="rebuild even if the cache is current")

    f = sub.add_parser("families", help="the architecture census: every model-level check on a tiny checkpoint "
                       "of every auto-mapped model type (docs/families.md)")
    f.add_argument("--only", help="comma-separated model types (default: every one)")
    f.add_argument("--setups", default="plain,qlora", help="comma-separated set-ups (default: plain,qlora)")
    f.add_argument("--out", help="folder for families.md and families.json (default: docs/ for a full census; "
                   "none with --only)")
    f.add_argument("--work", help="a folder for the tiny checkpoints and the raw records (default: a temp folder)")

    e = sub.add_parser("explain", help="the causes of an error text you hold (a traceback, a log tail, a Trainer "
                       "log), ranked; confirmed on your model with --ckpt")
    e.add_argument("file", nargs="?", default="-", help="the text: a file, or - for standard input (default)")
    e.add_argument("--json", action="store_true", help="print {symptom, causes: [...]} as JSON")
    e.add_argument("--list", action="store_true", help="the symptoms it knows, their causes and checks")
    e.add_argument("--ckpt", metavar="CKPT", help="run the checks the causes name on this checkpoint, adapter folder, "
                   "Trainer output_dir or hub id, and mark each cause confirmed or ruled out")
    e.add_argument("--base", help="with --ckpt: the base for an adapter (default: the one adapter_config.json names)")
    e.add_argument("--setup", help="with --ckpt: plain | qlora | sft | module:function, as you trained")
    e.add_argument("--quant", default=None, choices=["none", "4bit", "8bit"], help="with --ckpt: quantization")
    e.add_argument("--gpus", default=None, help="with --ckpt: the GPUs one training process saw")
    e.add_argument("--training-args", metavar="FILE", help="with --ckpt: your TrainingArguments as YAML or JSON")
    e.add_argument("--data", help="with --ckpt: your training data (JSONL or save_to_disk folder)")
    e.add_argument("--reports-dir", default="reports", help="with --ckpt: where the report goes (default reports/)")
    e.add_argument("--reproduce", action="store_true",
                   help="replay the failing step on a tiny twin of CKPT's family (from its config) on the CPU, "
                        "then name the smallest change of set-up that makes it pass")

    p = sub.add_parser("plan", help="will the training step fit: one step of your model code on fake tensors at full "
                       "size (no weight read), against a GPU or a budget")
    p.add_argument("checkpoint", help="a checkpoint folder, a config.json's folder, an adapter folder or a hub id")
    p.add_argument("--training-args", metavar="FILE", help="TrainingArguments / SFTConfig fields as YAML or JSON "
                   "(batch, gradient checkpointing and its kwargs, optim, bf16/fp16, gradient accumulation)")
    p.add_argument("--peft", metavar="ADAPTER", help="an adapter_config.json or adapter folder: LoRA on the model")
    p.add_argument("--setup", default="plain", choices=["plain", "qlora"],
                   help="plain: the model as loaded; qlora: a 4-bit base, prepare_model_for_kbit_training, LoRA")
    p.add_argument("--base", help="for an adapter folder: the base whose config to read")
    p.add_argument("--seq", type=int, help="sequence length (default: the training arguments' max_length, else 1024)")
    p.add_argument("--batch", type=int, help="per-device batch (default: the training arguments')")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the step runs (default cuda)")
    p.add_argument("--dtype", default="auto", help="load dtype: auto (config.json's), bf16, fp16, fp32")
    p.add_argument("--gpu", help="the GPU's name (h100, a100-40gb, l4, rtx4090, …)")
    p.add_argument("--memory", help="the memory budget instead of --gpu: 24GiB, 80GB, bytes")
    p.add_argument("--gpus", type=int, default=None, help="GPUs in the launch (default: the accelerate config's "
                   "num_processes, else 1): with fsdp / fsdp_config (or a DeepSpeed ZeRO-3 config) in the training "
                   "arguments or the accelerate config, one rank's step under FSDP; else DDP (adds its buffers)")
    p.add_argument("--accelerate-config", metavar="FILE", help="the YAML `accelerate config` wrote, as you pass it "
                   "to `accelerate launch --config_file`: processes, mixed precision, FSDP or DeepSpeed ZeRO-3")
    p.add_argument("--packed", action="store_true", help="batches without padding (packing, or every row at the full "
                   "length): the model skips its attention mask (default: padded batches; SFTConfig(packing=True) "
                   "implies it)")
    p.add_argument("--quick", action="store_true", help="the step alone: no largest batch / sequence, no toggles")
    p.add_argument("--no-heap-measure", action="store_true", help="--device cpu: do not measure this host's malloc "
                   "by a real step of the model with random weights (one training step's time); glibc's line is "
                   "then the replay of the planned tensors, which a default malloc exceeds")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    sub.add_parser("regressions", help="the table of known regressions run.versions checks a run against")

    lab = sub.add_parser("lab", help="JupyterLab with the panel and the notebooks open (prints the URL)")
    lab.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    return parser


def add_diagnose_options(d: argparse.ArgumentParser) -> None:
    """The options that say how a checkpoint is diagnosed: `diagnose`'s, which `sweep` passes to every member."""
    d.add_argument("--cell-timeout", type=int, default=1800,
                   help="seconds one notebook cell may run before it is stopped and marked error (default 1800)")
    d.add_argument("--adapter", help="a PEFT adapter folder to apply on CKPT")
    d.add_argument("--base", help="override the base an adapter CKPT records in adapter_config.json")
    d.add_argument("--quant", default=None, choices=["none", "4bit", "8bit"], help="quantization to load with")
    d.add_argument("--gpus", default=None,
                   help="diagnose as if the training process saw N GPUs (default: not stated — judged on one, and "
                        "what more GPUs in one process would do is a warn naming that condition)")
    d.add_argument("--serve", nargs="+", metavar="ENGINE",
                   help="the engines you serve the adapter on (vllm, llama.cpp, tgi, sglang; notebook 10): their "
                        "defects are fails (default: every engine judged, a defect of one is a warn)")
    d.add_argument("--setup", help="plain | qlora | sft | module:function (your own model factory)")
    d.add_argument("--params", help="a YAML parameters file (see parameters/defaults.yaml)")
    d.add_argument("--device-map", help="device_map for loading: auto, balanced, cpu, N or JSON")
    d.add_argument("--max-memory", help="per-device memory, accelerate's format: 0=20GiB,1=20GiB,cpu=64GiB")
    d.add_argument("--dtype", default="auto", help="load dtype: auto (the checkpoint's), bf16, fp16, fp32")
    d.add_argument("--distributed", type=int, default=0,
                   help="ranks for the DDP/FSDP2 probes under torchrun (notebook 06; default 0: not run)")
    d.add_argument("--recipes", help="a recipes YAML to evaluate side by side in notebook 05 (parameters/recipes.yaml)")
    d.add_argument("--data", help="the training data for notebook 07: a JSONL (messages, prompt/completion or text) "
                   "or a datasets.save_to_disk folder")
    d.add_argument("--training-args", metavar="FILE",
                   help="the training configuration for notebook 09: a YAML or JSON file of TrainingArguments "
                        "fields (config_class: SFTConfig for a trl config)")
    d.add_argument("--reports-dir", default="reports", help="where reports go (default: reports/)")
    d.add_argument("--notebooks", nargs="*", help="only these notebooks (by number or name prefix)")
    d.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own Python code")
    d.add_argument("--download", action="store_true",
                   help="a hub id's weights too (without it: configs, tokenizer and adapter files, the base's "
                        "safetensors headers by range requests, and only the notebooks that need no weight)")
    d.add_argument("--allow-pickle", action="store_true",
                   help="load pickle weights (.bin) with torch.load(weights_only=True), and a run's "
                        "training_args.bin with torch.load(weights_only=False) (it runs code); refused by default")


def cmd_families(args) -> int:
    import time

    from workbench.architectures.census import SETUPS, run_census
    from workbench.architectures.families_doc import finalized, summary, write
    from workbench.architectures.model_types import architectures

    setups = tuple(s for s in args.setups.split(",") if s)
    unknown = set(setups) - set(SETUPS)
    if unknown:
        raise UsageError(f"--setups: {sorted(unknown)} unknown; the census runs {', '.join(SETUPS)}")
    only = [t for t in (args.only or "").split(",") if t]
    known = {a.model_type for a in architectures()}
    if set(only) - known:
        raise UsageError(f"--only: {sorted(set(only) - known)} are not auto-mapped model types of this transformers")
    start = time.monotonic()
    records = run_census(setups, only or None, Path(args.work) if args.work else None)
    out = args.out or (None if only else "docs")
    if out:
        for path in write(records, Path(out)):
            print(f"wrote {path}")
    records = finalized(records)
    for r in records:
        state = "not built: " + (r["reason"] or "") if not r["built"] else (
            "clean" if not r["problems"] else "; ".join(f"{p['id']} {p['verdict']}: {p['title']}" for p in r["problems"]))
        print(f"{r['model_type']:<28} {r['setup']:<6} {state[:200]}")
    s = summary(records)
    print(f"{s['architectures']} architectures, {s['built']} built, clean: "
          + ", ".join(f"{k} {v}" for k, v in s["clean"].items()) + f"; {time.monotonic() - start:.0f} s")
    return 1 if s["records_with_problems"] else 0


def cmd_demo(args) -> int:
    from workbench.demo.build import build_demo, build_demo_recipes

    paths = build_demo(force=args.force)
    for label in ("qwen_base", "qwen_stage1", "qwen_stage2", "llama"):
        print(f"{label:12} {getattr(paths, label)}")
    recipes = build_demo_recipes(force=args.force)
    print(f"{'recipes':12} {recipes.recipes_file}")
    from workbench.demo.chat_data import demo_chat_data

    print(f"{'chat data':12} {demo_chat_data()}   (notebook 07: --data)")
    return 0


def cmd_lab(args) -> int:
    from workbench.interactive.lab import serve

    return serve(port=args.port or None)


def cmd_census(args) -> int:
    from workbench.diagnose_command import hub_mode
    from workbench.model.target import resolve_target
    from workbench.probes.dtype.headers import checkpoint_probe

    target = resolve_target(args.checkpoint, trust_remote_code=args.trust_remote_code, headers_only=True,
                            hub=hub_mode(args))
    target.require_model()
    result = checkpoint_probe(target)
    finding = result.findings()[0]
    rows = [row for census in result.censuses for row in census.rows]
    read = sum(c.bytes_read for c in result.censuses)
    if args.json:
        print(json.dumps({"integrity": finding.to_dict(), "census": rows, "header_bytes_read": read}, indent=2))
    else:
        print(result)  # the same view as notebook 01's: the integrity finding, then the census
    return 1 if finding.verdict in FAILING_VERDICTS else 0


def cmd_explain(args) -> int:
    from workbench.explain.command import explain_command

    return explain_command(args)


def cmd_plan(args) -> int:
    from workbench.plan.command import plan_command

    return plan_command(args)


def cmd_regressions(args) -> int:
    from workbench.probes.run.versions import print_regressions

    return print_regressions() or 0


def cmd_checks(args) -> int:
    from workbench.catalog import CHECK_IDS, CHECKS, NOTEBOOKS, markdown_table

    if args.where:
        if args.where not in CHECK_IDS:
            raise UsageError(f"checks --where {args.where!r}: no such check; `python -m workbench checks` lists them")
        from workbench.check_origin import check_origin

        print(check_origin(args.where).text())
    elif args.json:
        print(json.dumps({"checks": [c.as_dict() for c in CHECKS],
                          "notebooks": [{"name": n.name, "title": n.title, "checks": list(n.checks),
                                         "steps": [s.name for s in n.steps]} for n in NOTEBOOKS]}, indent=2))
    elif args.markdown:
        print(markdown_table())
    else:
        for nb in NOTEBOOKS:
            print(f"{nb.title}")
            for c in (c for c in CHECKS if c.notebook == nb.name):
                print(f"  {c.id}\n      {c.question}")
                for verdict, meaning in c.verdicts.items():
                    print(f"      {verdict:5}  {meaning}")
    return 0


def cmd_diagnose(args) -> int:
    from workbench.diagnose_command import check_diagnose_options, diagnose_as_asked
    from workbench.report.runner import exit_code

    if not args.checkpoint and (args.adapter or args.base or args.run_checkpoint is not None):
        raise UsageError("--adapter/--base/--checkpoint need a CKPT; without one the bundled demo is diagnosed")
    if args.jobs < 0:
        raise UsageError(f"--jobs {args.jobs}: use 1 or more (0 chooses by cores and memory)")
    check_diagnose_options(args)
    folder, findings = diagnose_as_asked(args, jobs=args.jobs or None)
    failing = [f for f in findings if f.verdict in FAILING_VERDICTS]
    if failing:
        from workbench.display.findings_view import findings_lines

        print(findings_lines(failing).text())
    print(f"report: {folder}")
    return exit_code(findings)


def cmd_sweep(args) -> int:
    from workbench.sweep.command import sweep_command

    return sweep_command(args)


def _user_offline() -> bool:
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in
               ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def main(argv: list[str] | None = None) -> int:
    user_offline = _user_offline()  # before quiet_and_offline sets the default
    quiet_and_offline()
    skip_slow_optional_imports()
    args = build_parser().parse_args(argv)
    args.user_offline = user_offline
    handler = {"diagnose": cmd_diagnose, "census": cmd_census, "checks": cmd_checks, "demo": cmd_demo,
               "lab": cmd_lab, "families": cmd_families, "regressions": cmd_regressions,
               "explain": cmd_explain, "plan": cmd_plan, "sweep": cmd_sweep}[args.command]
    try:
        return handler(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `python -m workbench checks | head`: the reader left; nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        # the interrupted cell's task (nbclient's async_execute_cell) ends with DeadKernelError once its kernel is
        # stopped, and nothing awaits it any more: asyncio would print that traceback as the process exits
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        print("interrupted: no report was completed (a partial one, if any, is a hidden .partial folder)",
              file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):
            print(f"error: cannot write {exc.filename or 'the report'} ({exc.strerror}); free some space or pass "
                  "a writable --reports-dir", file=sys.stderr)
            return 2
        return _crash(exc)
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line on the terminal, the traceback in a log
        return _crash(exc)


def _crash(exc: BaseException) -> int:
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"workbench-crash-{os.getpid()}.log"
    with contextlib.suppress(OSError):
        log.write_text("".join(traceback.format_exception(exc)) + getattr(exc, "kernel_traceback", ""))
    print(f"error: the workbench crashed ({type(exc).__name__}: {exc}); traceback in {log}", file=sys.stderr)
    return 2
