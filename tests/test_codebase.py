"""Who else in a code base uses a module's functions (`pipeline/codebase.py`), and the pmap rule's
use of it: a state returned from a function whose result nobody reads, a def reading device 0's
copy that no other module calls (`codemods/pmap/_passon.py`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.pipeline.project import Project
from jaxmigrate.toolkit.passes import Callers, Outside

PROJECT = FIXTURES / "pmap" / "projects" / "script_callers"


def notebook(*cells: str) -> str:
    return json.dumps(
        {
            "cells": [
                {"cell_type": "code", "metadata": {}, "outputs": [], "source": c} for c in cells
            ],
            "metadata": {"language_info": {"name": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the fixture project (a folder of scripts), its `train.py` the module read."""
    shutil.copytree(PROJECT, tmp_path / "p", ignore=shutil.ignore_patterns("*.expected.py"))
    return tmp_path / "p" / "examples" / "imagenet"


def uses(path: Path) -> Callers | None:
    return Project().outside_uses(str(path / "train.py"))


def declines(path: Path) -> list[str]:
    source = (path / "train.py").read_text()
    result = migrate_source(source, options=Options(), path=str(path / "train.py"))
    return [s.message.split("not taken: ")[1].split("; the helper")[0] for s in result.sites]


def test_siblings_calling_as_a_statement_or_rebinding_the_result_do_not_read_it(
    project: Path,
) -> None:
    found = uses(project)
    assert found is not None and not found.everywhere
    assert found.of("train_and_evaluate") == Outside(called="in `demo.ipynb[cell 2]`")
    assert found.of("TrainState").read == "in `demo.ipynb[cell 3]`"
    assert found.of("save_checkpoint") == Outside()  # no other module names it


def test_a_result_read_after_the_loop_is_read(project: Path) -> None:
    (project / "demo.ipynb").write_text(
        notebook(
            "import train\n",
            "for lr in (1, 2):\n    state = train.train_and_evaluate([], [])\n",
            "state.params\n",
        )
    )
    assert uses(project).of("train_and_evaluate").read == "in `demo.ipynb[cell 2]`"  # type: ignore[union-attr]
    assert declines(project)[1] == (
        "[PL303] `state` is returned by `train_and_evaluate` with its device axis, and "
        "`train_and_evaluate`'s result is read in `demo.ipynb[cell 2]`"
    )


@pytest.mark.parametrize(
    ("code", "read"),
    [
        ("def f():\n    s = train.train_and_evaluate([], [])\n    return 1\n", ""),
        ("def f():\n    s = train.train_and_evaluate([], [])\n    return s\n", "in `other.py:3`"),
        (
            "def f():\n    s = train.train_and_evaluate([], [])\n    g = lambda: s\n",
            "in `other.py:3`",
        ),
        ("s = train.train_and_evaluate([], [])\n", "in `other.py:2`"),  # another module may
        ("s = train.train_and_evaluate([], [])\ns = 1\n", ""),
        (
            "def g():\n    return s\ns = train.train_and_evaluate([], [])\ns = 1\n",
            "in `other.py:4`",
        ),
        ("x = [train.train_and_evaluate([], [])]\n", "in `other.py:2`"),
    ],
)
def test_when_a_bound_result_is_read(project: Path, code: str, read: str) -> None:
    (project / "other.py").write_text("import train\n" + code)
    (project / "demo.ipynb").unlink()
    assert uses(project).of("train_and_evaluate").read == read  # type: ignore[union-attr]


def test_the_module_passed_as_a_value_or_a_star_import_uses_every_function(
    project: Path,
) -> None:
    (project / "other.py").write_text("import train as t\n\nrun(t)\n")
    assert uses(project).of("save_checkpoint") == Outside("in `other.py:3`", "in `other.py:3`")  # type: ignore[union-attr]
    (project / "other.py").write_text("from train import *\n\ntrain_and_evaluate([], [])\n")
    assert uses(project).of("save_checkpoint").read == "in `other.py:1`"  # type: ignore[union-attr]
    assert uses(project).of("train_and_evaluate").read == "in `other.py:1`"  # type: ignore[union-attr]
    (project / "other.py").write_text("import train\ndef (:\n")
    assert uses(project).of("save_checkpoint").called == "in `other.py`, which does not parse"  # type: ignore[union-attr]


def test_a_def_reading_device_0_called_by_a_sibling_is_left_alone(project: Path) -> None:
    (project / "other.py").write_text("from train import save_checkpoint as save\n\nsave(1, [])\n")
    assert declines(project)[1] == (
        "[PL303] `save_checkpoint` reads device 0's copy of a value replicated for the step, and "
        "is also used in `other.py:3`: its callers there may pass another layout"
    )


def test_a_module_of_a_package_may_be_used_from_outside_the_code_base(project: Path) -> None:
    (project / "__init__.py").write_text("")
    (project.parent / "__init__.py").write_text("")
    found = uses(project)
    assert found is not None
    assert found.everywhere == (
        "from outside the code base maybe (`examples.imagenet.train` is in package `examples`)"
    )
    assert found.of("_private") == Outside()  # the module's own, by its name
    assert declines(project)[1] == (
        "[PL303] `save_checkpoint` reads device 0's copy of a value replicated for the step, and "
        "is also used from outside the code base maybe (`examples.imagenet.train` is in package "
        "`examples`): its callers there may pass another layout"
    )


def test_a_text_alone_has_no_code_base() -> None:
    assert Project().outside_uses(None) is None


SAVED = (FIXTURES / "pmap" / "program_save_checkpoint.py").read_text()


def text_declines(source: str) -> list[str]:
    result = migrate_source(source, options=Options())
    return [s.message.split("not taken: ")[1].split("; the helper")[0] for s in result.sites]


def test_a_def_named_in_all_is_used_elsewhere() -> None:
    source = SAVED + '\n__all__ = ["_save_checkpoint"]\n'
    assert text_declines(source)[1] == (
        "[PL303] `_save_checkpoint` reads device 0's copy of a value replicated for the step, "
        "and is also used in a string (`__all__`): its callers there may pass another layout"
    )


def test_a_value_returned_from_a_method_is_read_by_callers_not_followed() -> None:
    body = SAVED[SAVED.index("def _train_and_evaluate") : SAVED.index("def main")]
    method = "class Trainer:\n    " + body.replace("\n", "\n    ").replace(
        "(saved, losses)", "(self, saved, losses)", 1
    )
    source = SAVED[: SAVED.index("def _train_and_evaluate")] + method.rstrip() + "\n"
    assert text_declines(source)[1] == (
        "[PL303] `state` is returned by `_train_and_evaluate` with its device axis, and "
        "`_train_and_evaluate`'s result is read where its callers are not followed (it is no def "
        "at module level)"
    )
