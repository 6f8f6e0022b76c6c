"""Imported at start-up by every Python process of the test's local Ray cluster (tests/sweep/test_engines.py puts
this folder on the cluster helper's PYTHONPATH, which the raylet's agents, monitors and workers inherit). Each of
them imports ray, and ray imports jsonschema (ray 2.60 _private/runtime_env/plugin_schema_manager.py), whose optional
rfc3987_syntax compiles its grammars at import: `runtime.skip_slow_optional_imports` keeps it out, as the CLI keeps
it out of its own process. On this project's machine the cluster's start took 11.1 s of CPU and 7.0 s without this,
3.3 s and 3.4 s with it."""

from workbench.runtime import skip_slow_optional_imports

skip_slow_optional_imports()
