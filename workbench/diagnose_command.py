"""What `diagnose` was asked, turned into a diagnosis: its options checked, the target resolved, the report run.

One path for every command that diagnoses a checkpoint from command-line options: `workbench diagnose` runs it once,
`workbench sweep` once per member (in this process, a worker process or a Ray task), so a sweep's member report is
the report `diagnose` gives for that checkpoint. `args` is the argparse namespace of `diagnose`'s options
(`cli.add_diagnose_options`), with `user_offline` set by the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from workbench.errors import UsageError


def check_diagnose_options(args) -> None:
    """Refuse unusable options before anything starts (exit 2, one line)."""
    from workbench.report.runner import check_reports_dir

    if args.cell_timeout < 1:
        raise UsageError(f"--cell-timeout {args.cell_timeout}: use a number of seconds, 1 or more")
    if args.gpus is not None and args.gpus.strip() == "0":
        raise UsageError("--gpus 0: the training process must see at least 1 GPU to diagnose; use 1 or more (leave "
                         "--gpus out when you do not want to say)")
    if args.distributed == 1 or not 0 <= args.distributed <= 64:
        raise UsageError(f"--distributed {args.distributed}: use a number of ranks from 2 to 64 (0: not run)")
    check_reports_dir(Path(args.reports_dir))


def diagnose_as_asked(args, *, jobs: int | None, reports_dir: Path | None = None,
                      echo: Callable[[str], None] = print, kept_kernel=None):
    """Resolve the target and run its diagnosis into `reports_dir` (default `args.reports_dir`): (folder, findings).
    `jobs`: notebooks side by side (1: one kernel, started before the target is resolved so that the stack's
    imports overlap reading the target's files). `kept_kernel`: a kernel kept across diagnoses (`start_kernel`; a
    sweep's members in series), reset for this one (`Kernel.begin_diagnosis`) and left running for the next."""
    from workbench.report.runner import NOTEBOOK_DIR, diagnose, find_notebooks, prepare_execution, start_kernel

    jobs = 1 if args.distributed else jobs
    # a CKPT that is no folder (a hub id, a typo) is resolved first, so that a typo gets its error without a kernel
    local = not args.checkpoint or Path(args.checkpoint).expanduser().is_dir()
    keep = kept_kernel is not None and jobs == 1
    if keep:
        kept_kernel.begin_diagnosis([nb.stem for nb in find_notebooks(NOTEBOOK_DIR, only=args.notebooks)],
                                    args.setup or "plain")
    kernel = kept_kernel if keep else start_kernel(only=args.notebooks) if jobs == 1 and local else None
    try:
        # with one kernel, the checks that need torch and transformers run there (`Kernel.check_target`)
        target = diagnosis_target(args, headers_only=jobs == 1)
        only = notebooks_without_weights(target, args.notebooks)
        if not keep:  # a fresh kernel imports the stack first: its load's reads overlap those imports
            _prefetch_weights(target, only)
        if jobs == 1 and not target.model_unavailable:
            kernel = kernel or start_kernel(only=only)
            prepare_execution(find_notebooks(NOTEBOOK_DIR, only=only))  # while the kernel imports the stack
            if not kernel.check_target(target):
                from workbench.model.target import check_with_the_stack

                check_with_the_stack(target.setup, target.model_dir, target.trust_remote_code)
    except BaseException:
        if kernel is not None and not keep:
            kernel.close()
        raise
    return diagnose(target, reports_dir=Path(reports_dir or args.reports_dir), only=only,
                    cell_timeout=args.cell_timeout, jobs=jobs, kernel=kernel, echo=echo,
                    extra_parameters={"distributed": args.distributed}, keep_kernel=keep)


def _prefetch_weights(target, only: list[str] | None) -> None:
    """The target's weight files read into the page cache meanwhile (`model.prefetch`), where that helps."""
    from workbench.model.prefetch import available_memory, files_to_prefetch, start_prefetch
    from workbench.report.runner import NOTEBOOK_DIR, find_notebooks

    files, _why_not = files_to_prefetch(target, [nb.stem for nb in find_notebooks(NOTEBOOK_DIR, only=only)],
                                        available_memory())
    start_prefetch(files)


def diagnosis_target(args, headers_only: bool = False):
    """The target `diagnose` was asked for: the demo when no CKPT (built on first use), the recipes file read.
    `headers_only`: the set-up and the architecture are checked by the caller (`check_with_the_stack`)."""
    from workbench.model.target import resolve_target
    from workbench.notebook import with_demo_fallback
    from workbench.params import load_params

    options, demo = with_demo_fallback({"checkpoint": args.checkpoint, "quant": args.quant, "setup": args.setup,
                                        "gpus": args.gpus, "params_json": json.dumps(load_params(args.params))})
    if demo:
        from workbench.demo.build import demo_recipes_ready

        print(f"no CKPT given: diagnosing the bundled demo's stage-2 adapter ({options['checkpoint']})")
        if not demo_recipes_ready():
            print("notebook 05 first trains the demo's recipes (once, about 1.5 min on 2 cores)")
    params = json.loads(options["params_json"])
    if args.serve:
        from workbench.probes.serve.engine_rules import engine_rules

        try:
            engine_rules().resolve(args.serve)  # an unknown engine: exit 2 now, naming the known ones
        except ValueError as exc:
            raise UsageError(f"--serve: {exc}") from None
        params["serve_engines"] = list(args.serve)
    if args.recipes:
        from workbench.probes.evaluation.recipes import read_recipes

        read_recipes(args.recipes)  # unusable file: exit 2 now, not an error deep in a notebook
        params["recipes"] = str(Path(args.recipes).resolve())
    if args.training_args:
        from workbench.probes.train.configuration import read_training_args_file

        read_training_args_file(args.training_args)  # unknown fields: exit 2 now, naming them
    return resolve_target(options["checkpoint"], adapter=args.adapter, base=args.base, quant=options["quant"] or "none",
                          gpus=options["gpus"], setup=options["setup"], params=params, device_map=args.device_map,
                          max_memory=args.max_memory, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                          allow_pickle=args.allow_pickle, data=args.data, run_checkpoint=args.run_checkpoint,
                          training_args=args.training_args, hub=hub_mode(args), headers_only=headers_only)


def hub_mode(args) -> str:
    """How hub ids are reached: fetched unless the user set HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE themselves."""
    if args.user_offline:
        return "cache"
    return "download" if getattr(args, "download", False) else "headers"


def notebooks_without_weights(target, only: list[str] | None) -> list[str] | None:
    """A hub base whose weights stayed on the hub: the notebooks that read files and headers alone, said so."""
    from workbench.model.hub import HEADERS_ONLY_NOTEBOOKS, weights_left_on_hub

    left = weights_left_on_hub(target.model_dir)
    if left is None:
        return only
    files, size = left
    wanted = [n for n in (only or HEADERS_ONLY_NOTEBOOKS) if n.startswith(HEADERS_ONLY_NOTEBOOKS)]
    from workbench.display.text import size_text

    print(f"{target.base or target.checkpoint}: weights left on the hub ({files} file(s), {size_text(size)}); "
          f"running notebook {', '.join(HEADERS_ONLY_NOTEBOOKS)} (files and headers) only. The notebooks that load "
          "the model need them: pass --download")
    if not wanted:
        raise UsageError(f"--notebooks {' '.join(only or [])}: these load the model, whose weights are on the hub "
                         f"({size_text(size)}); pass --download")
    return wanted
