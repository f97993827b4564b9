"""The checkout's conftest: the suite runs from a checkout that is not installed, as it does installed.

pytest puts this folder first on ``sys.path`` (a rootdir conftest, ``prepend`` import mode), so ``conformance``
imports from the checkout, and ``pytest_plugins`` loads the suite's plugin for the runs started here: the main job
(``pytest -n auto --nodes 2``: the ``testpaths`` are the property modules) and the self-tests (``pytest tests``).
Installed (``pip install -e .``), the package registers the same module through its ``pytest11`` entry point, which
pytest loads before any conftest: then this file asks for nothing, so the plugin is registered once, and a run
started in another folder that collects the checkout's properties (the suite selected by an option alone, see
docs/reference.md) finds no ``pytest_plugins`` here, which pytest allows only in a top-level conftest.
"""

import sys

if "conformance.plugin" not in sys.modules:
    pytest_plugins = ["conformance.plugin"]
