"""`workbench sweep`: many checkpoints diagnosed side by side, and one comparison report over them.

    members.py     which folders a sweep (or a checkpoint history) diagnoses, in which order, under which names
    member_run.py  one member's diagnosis: the `diagnose` path (workbench.diagnose_command) into the member's own report
    local_engine.py, ray_engine.py   where the members run: this machine (in series or N processes), a Ray cluster
    needs.py       what one member asks a scheduler for: CPUs, a GPU, memory from its safetensors headers
    verdicts.py    sweep.json: each member's verdicts, the first member at which each check turned bad
    changes.py     what changed from one member to the next (adapter norms, log entries, configs, tokenizer, dtypes)
    comparison.py  the comparison page's blocks, shown by notebooks/12_sweep.ipynb
    command.py     the CLI: members resolved, the engine run, sweep.json and index.html written
"""
