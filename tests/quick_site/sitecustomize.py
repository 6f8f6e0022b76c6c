"""Imported at start-up by the Python processes the suite starts whose imports it does not test: the local Ray
cluster's (tests/sweep/test_engines.py puts this folder on the cluster helper's PYTHONPATH, which the raylet's agents,
monitors and workers inherit) and JupyterLab's (tests/interactive/test_lab_in_browser.py,
tests/sweep/test_sweep_page.py). Ray imports jsonschema (ray 2.60 _private/runtime_env/plugin_schema_manager.py), and
so does JupyterLab's server (jupyter_events); jsonschema's optional rfc3987_syntax compiles its grammars at import:
`runtime.skip_slow_optional_imports` keeps it out, as the CLI keeps it out of its own process. On this project's
machine the Ray cluster's start took 11.1 s of CPU and 7.0 s without this, 3.3 s and 3.4 s with it; importing
JupyterLab's server 2.2–2.8 s of CPU without, 1.0–1.1 s with it."""

from workbench.runtime import skip_slow_optional_imports

skip_slow_optional_imports()
