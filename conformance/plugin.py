"""The suite's pytest entry point: it registers the options, and does nothing else unless the suite is selected.

Installed, this module is loaded into every pytest run of the environment (the ``pytest11`` entry point). It
is a guest there: it imports only pytest and the standard library, changes no setting (Hypothesis profile,
seed, JUnit path), starts nothing and writes nothing.

The suite is *selected* when

- ``--conformance`` or any other option of the suite is given (``--nodes 2``, ``--backends real``, ...), or
- the run's arguments name the suite's property tests (a path inside ``conformance/properties``, the
  checkout's ``testpaths``, ``--pyargs conformance.properties``).

Only then is :class:`conformance.harness.run.ConformanceRun` registered: it checks the set-up (one line and
pytest's usage-error exit code when it cannot work), owns the rank world, drives Hypothesis and writes the
reports.  Selected by an option alone, it collects the property tests itself, so ``--opt VALUE`` and
``--opt=VALUE`` give the same run wherever pytest starts.  pytest-xdist is optional.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.options import FLAGS, OPTIONS, given_options

#: Name under which the selected run is registered with pytest's plugin manager.
RUN_PLUGIN = "conformance-run"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "DeepEP conformance (any of these selects the suite)")
    for flag, help_text in FLAGS:
        group.addoption(flag, action="store_true", default=False, help=help_text)
    for option in OPTIONS:
        group.addoption(option.flag, type=option.type, default=None, metavar=option.metavar, help=option.help,
                        choices=option.choices)


def properties_dir() -> Path:
    """The folder of the suite's property tests (found without importing them)."""
    spec = importlib.util.find_spec("conformance.properties")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def names_properties(config: pytest.Config, arg: str) -> bool:
    """Whether the collection argument ``arg`` reaches the property tests."""
    target = arg.split("::", 1)[0]
    if config.option.pyargs and target.startswith("conformance.properties"):
        return True
    props = properties_dir()
    path = (config.invocation_params.dir / target).resolve()
    if path == props or props in path.parents:
        return True
    # An ancestor counts only in the suite's own checkout (not, say, a virtualenv inside another project).
    return props == config.rootpath / "conformance" / "properties" and path in props.parents and (
        path == config.rootpath or config.rootpath in path.parents)


def selected(config: pytest.Config) -> bool:
    """Whether this pytest run runs the suite (see the module docstring)."""
    if given_options(config.option):
        return True
    return any(names_properties(config, arg) for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance_property(id): a DeepEP conformance property test")
    if not selected(config):
        return
    if not any(names_properties(config, arg) for arg in config.args):
        # Selected by an option: collect the properties ourselves.  (A value written after a space, as in
        # ``--baseline PATH``, can make pytest miss the ini file and its testpaths: this does not depend on them.)
        from_user = config.args if config.args_source == pytest.Config.ArgsSource.ARGS else []
        config.args = [*from_user, str(properties_dir())]
    from conformance.harness.run import ConformanceRun

    config.pluginmanager.register(ConformanceRun(config), RUN_PLUGIN)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """With GPUs, ``-n auto`` starts only as many workers as there are disjoint GPU slices; with ``--rank-setup
    shared`` (every world on the first GPU) ``devices.shared_gpu_workers()`` of them: min(4, cores // 4).  (xdist asks
    before ``pytest_configure``, so this hook lives here.)"""
    if not selected(config) or config.option.device == "cpu":
        return None
    from conformance.harness.options import option_values

    values = option_values(config.option)
    if values["device"] == "cpu":
        return None
    from conformance.harness.devices import shared_gpu_workers, visible_gpus

    gpus = len(visible_gpus())
    if values["rank_setup"] == "shared":
        return shared_gpu_workers() if gpus else None
    world = values["nodes"] * values["ranks_per_node"]
    return max(1, gpus // world) if gpus >= world else None


@pytest.fixture(scope="session")
def conformance(request: pytest.FixtureRequest) -> Any:
    """The worker's :class:`~conformance.harness.session.Session` (its rank world starts on first use)."""
    run = request.config.pluginmanager.get_plugin(RUN_PLUGIN)
    if run is None:
        pytest.fail("the DeepEP conformance properties were collected, but the suite is not selected in this run: "
                    "pass --conformance (or any option of the suite)", pytrace=False)
    from conformance.properties import module_files

    # the properties this run selected (the JIT warm-up compiles for these only, not for the whole catalog)
    files = {os.path.realpath(str(item.path)) for item in request.session.items}
    yield from run.session_fixture(frozenset(pid for pid, path in module_files().items()
                                             if os.path.realpath(path) in files))
