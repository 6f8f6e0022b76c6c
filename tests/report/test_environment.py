"""The report's library versions: an imported library's own `__version__` equals its installed metadata's."""

import importlib.metadata

from workbench.environment import LIBRARIES, library_versions


def test_imported_and_installed_versions_agree():
    import peft
    import torch
    import transformers

    versions = library_versions()
    for lib in LIBRARIES:
        try:
            installed = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        assert versions[lib] == installed, lib
    assert {torch.__version__, transformers.__version__, peft.__version__} <= set(versions.values())
