"""The distribution: pyproject's packages and ranges, the wheel's metadata and package data, and the wheel installed
into a fresh virtual environment diagnosing a tiny checkpoint from a temporary folder."""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from repo import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_IGNORED = shutil.ignore_patterns(".venv", ".cache", ".git", "reports", "build", "dist", "*.egg-info",
                                       "__pycache__", "tests", "docs", "bench", ".pytest_cache")


def test_every_folder_of_python_modules_is_a_listed_package():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "workbench").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert on_disk <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(on_disk - listed)}"
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert {pkg: (ROOT / folder).is_dir() for pkg, folder in mapped.items()} == dict.fromkeys(mapped, True)
    assert {"workbench.notebooks", "workbench.parameters"} <= listed


def test_the_declared_ranges_admit_the_locked_versions():
    """A range that excluded the tested pins would ship a wheel nobody tested."""
    locked = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].strip().split("==")
            locked[name.lower().replace("_", "-")] = version
    extras = PYPROJECT["project"]["optional-dependencies"]
    for spec in PYPROJECT["project"]["dependencies"] + [s for group in extras.values() for s in group]:
        requirement = Requirement(spec)
        version = locked.get(requirement.name.lower().replace("_", "-"))
        assert version is not None, f"{requirement.name} is declared but not in requirements.lock"
        assert requirement.specifier.contains(version), f"{spec} excludes the locked {version}"


def build_wheel(out: Path) -> Path:
    """`pip wheel --no-deps --no-build-isolation` of a copy of the checkout (the build leaves nothing in it)."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=BUILD_IGNORED)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(out), str(source)], check=True, capture_output=True, timeout=300)
    return next(out.glob("*.whl"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.slow
def test_the_wheel_declares_requirements_script_and_package_data(wheel):
    from workbench.catalog import NOTEBOOKS

    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(whl.read(info))
        entry_points = whl.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert metadata["Name"] == "finetune-workbench"
    requires = {Requirement(r).name for r in metadata.get_all("Requires-Dist") if "extra ==" not in r}
    assert {"torch", "transformers", "peft", "bitsandbytes", "trl", "huggingface_hub", "papermill"} <= requires
    assert "workbench = workbench.cli:main" in entry_points
    shipped = {f"workbench/notebooks/{nb.name}.ipynb" for nb in NOTEBOOKS} | {
        "workbench/parameters/defaults.yaml", "workbench/parameters/recipes.yaml",
        "workbench/probes/run/regressions.yaml", "workbench/report/template/workbench_report/report.css",
        "workbench/explain/symptoms/dtype.yaml", "workbench/explain/symptoms/logs.yaml", "workbench/plan/unseen.yaml",
        "workbench/plan/gpus.yaml",
        "workbench/report/template/workbench_report/index.html.j2", "workbench/cli.py", "workbench/model/hub.py"}
    assert shipped <= names, sorted(shipped - names)


@pytest.mark.slow
def test_the_installed_wheel_diagnoses_from_a_temporary_folder(wheel, demo, tmp_path):
    """A fresh venv (the stack reached through a .pth to this environment's site-packages, so nothing is
    downloaded; the checkout's own editable install is not among them), the wheel installed with --no-deps."""
    venv = tmp_path / "venv"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "stack.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True, capture_output=True, timeout=300)
    # nbconvert's templates are data files of its install (share/jupyter/nbconvert), not importable modules
    (venv / "share" / "jupyter").mkdir(parents=True)
    (venv / "share" / "jupyter" / "nbconvert").symlink_to(Path(sys.prefix) / "share" / "jupyter" / "nbconvert")
    # the report notebooks' kernel, as `make install` registers it for a clone
    subprocess.run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", "workbench"], check=True,
                   capture_output=True, timeout=120)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "WORKBENCH_CACHE": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(venv / "bin" / "workbench"), "checks", "--json"], capture_output=True, text=True,
                           cwd=work, env=env, timeout=120)
    assert where.returncode == 0 and json.loads(where.stdout)["checks"], where.stderr
    located = subprocess.run([str(python), "-c", "import workbench.paths as p; print(p.NOTEBOOK_DIR)"],
                             capture_output=True, text=True, cwd=work, env=env, check=True).stdout.strip()
    assert Path(located).is_relative_to(site), located  # the wheel's own notebooks, not the checkout's
    result = subprocess.run([str(venv / "bin" / "workbench"), "diagnose", str(demo.llama), "--notebooks", "00",
                             "--reports-dir", "reports"], capture_output=True, text=True, cwd=work, env=env,
                            timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    report = json.loads(next((work / "reports").rglob("findings.json")).read_text())
    assert [n["status"] for n in report["notebooks"]] == ["ok"], (result.stdout, json.dumps(report["notebooks"]))
    assert not [f for f in report["findings"] if f["verdict"] == "error"], report["findings"]
