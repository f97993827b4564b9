"""The self-tests' own scheduling (tests/conftest.py): a test's group comes from its ``xdist_group`` marks and from
the shared runs it reads; the shared runs' groups come first, then the slow tests and the other groups; a worker
writes the groups where the controller's scheduler reads them (pytest 9.2 no longer lets xdist put them into ids)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest


class Item:
    """What the conftest's hooks read of a collected test."""

    def __init__(self, nodeid: str, groups: tuple[str, ...] = (), fixtures: tuple[str, ...] = (),
                 slow: bool = False) -> None:
        self.nodeid = nodeid
        self.fixturenames = list(fixtures)
        self.marks = [pytest.mark.xdist_group(name).mark for name in groups]
        if slow:
            self.marks.append(pytest.mark.slow.mark)

    def iter_markers(self, name: str) -> list:
        return [mark for mark in self.marks if mark.name == name]

    def get_closest_marker(self, name: str):
        return next(iter(self.iter_markers(name)), None)

    def add_marker(self, marker) -> None:
        self.marks.append(getattr(marker, "mark", marker))


def collected() -> list[Item]:
    return [Item("t.py::plain"), Item("t.py::world", groups=("worlds",)),
            Item("t.py::reads_catalog", fixtures=("catalog_runs", "tmp_path")), Item("t.py::slow", slow=True),
            Item("t.py::runs_suite", fixtures=("suite",)), Item("t.py::reads_catalog_too", fixtures=("catalog_runs",)),
            Item("t.py::world_and_planted", groups=("worlds",), fixtures=("planted_run",))]


def test_a_tests_group_is_its_marks_and_the_shared_runs_it_reads() -> None:
    assert conftest.xdist_groups(collected()) == {
        "t.py::world": "group:worlds", "t.py::reads_catalog": "group:catalog_runs",
        "t.py::reads_catalog_too": "group:catalog_runs", "t.py::world_and_planted": "group:planted_run_worlds"}


def test_shared_runs_first_then_slow_and_groups_and_the_worker_writes_the_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = tmp_path / "groups.json"
    monkeypatch.setenv(conftest.GROUPS_ENV, str(groups))
    items = collected()
    conftest.pytest_collection_modifyitems(SimpleNamespace(workerinput={"workerid": "gw7"}), items)
    assert [item.nodeid for item in items] == [
        "t.py::reads_catalog", "t.py::reads_catalog_too", "t.py::world_and_planted",  # the shared runs' groups
        "t.py::world", "t.py::slow", "t.py::runs_suite",  # a group, slow, slow by the suite fixture
        "t.py::plain"]
    assert json.loads(groups.read_text()) == conftest.xdist_groups(items)
    assert not list(tmp_path.glob("groups.json.*")), "the worker's own file is moved into place whole"
