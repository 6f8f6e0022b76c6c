"""`import workbench`, `--help` and a cached header census import neither torch nor transformers."""

import json
import os
import subprocess
import sys


def run_python(code, env=None):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_workbench_and_the_catalog_import_no_torch():
    out = run_python("import sys, workbench, workbench.catalog, workbench.notebook, workbench.cli\n"
                     "workbench.cli.build_parser()\n"
                     "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'peft') if m in sys.modules))")
    assert out.strip() == "[]"


def test_a_public_name_imports_on_first_use():
    out = run_python("import sys, workbench\nassert 'torch' not in sys.modules\n"
                     "print(workbench.dtype_census.__module__, 'torch' in sys.modules)")
    assert out.split() == ["workbench.probes.dtype.census", "True"]


def test_the_header_census_is_the_same_cold_and_cached_and_cached_imports_no_torch(demo, tmp_path):
    code = ("import json, sys\nfrom workbench.cli import main\nrc = main(['census', %r, '--json'])\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')" % str(demo.qwen_stage2))
    env = {"WORKBENCH_CACHE": str(tmp_path)}
    cold = run_python(code, env)
    warm = run_python(code, env)
    assert cold.rsplit("\n", 2)[-2] == "TORCH" and warm.rsplit("\n", 2)[-2] == "NO-TORCH"
    strip = lambda out: json.loads(out.rsplit("\n", 2)[0])["census"]  # noqa: E731
    assert strip(cold) == strip(warm) and {r["component"] for r in strip(warm)} >= {"vision", "language", "head"}
    assert list(tmp_path.glob("header-maps/*.json"))


def test_a_built_demo_is_reused_without_importing_the_libraries_its_stamp_names(demo):
    """`workbench diagnose` with no CKPT finds the demo built by its stamp, which names the transformers and peft it
    was built with: read from their metadata, not by importing them (peft brings transformers, torch and
    bitsandbytes: 6 s of the CLI's 8 s of CPU). Reused here, not rebuilt: the stamp this process reads equals the one
    the session's build wrote in a test process that had imported them."""
    code = ("import sys\nfrom pathlib import Path\nfrom workbench.demo.build import DemoPaths, build_demo\n"
            "root = Path(%r)\nbefore = (root / 'DEMO_STAMP.json').stat().st_mtime_ns\n"
            "assert isinstance(build_demo(root), DemoPaths)\n"
            "assert (root / 'DEMO_STAMP.json').stat().st_mtime_ns == before, 'rebuilt'\n"
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))" % str(demo.root))
    assert run_python(code).strip() == "[]"
