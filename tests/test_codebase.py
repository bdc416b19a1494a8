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


# A closed code base (`[tool.jaxmigrate] closed-code-base = true`): nothing outside it imports
# its modules, so a module of a package is used only where the code base's own files use it.
def closed_base(tmp_path: Path, files: dict[str, str], closed: bool = True) -> Path:
    table = "[tool.jaxmigrate]\nclosed-code-base = true\n" if closed else ""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\n\n' + table)
    for name, text in {"app/__init__.py": "", "app/evals/__init__.py": "", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def closed_uses_of(root: Path, module: str = "app/evals/cls.py") -> Callers:
    found = Project().outside_uses(str(root / module))
    assert found is not None and not found.everywhere
    return found


def test_a_closed_code_base_uses_a_module_only_where_its_files_do(tmp_path: Path) -> None:
    root = closed_base(
        tmp_path,
        {
            "app/evals/cls.py": "def get_fn(f):\n    return f\n\n\nclass Evaluator:\n    pass\n",
            "app/common.py": (  # big_vision's `evaluators.from_config`
                "import importlib\n\n\ndef from_config(specs):\n    out = []\n"
                "    for module in specs:\n"
                '        module = importlib.import_module(f"app.evals.{module}")\n'
                "        out.append(module.Evaluator())\n    return out\n"
            ),
            "app/train.py": "from app.evals import cls\n\nfn = cls.get_fn(abs)\n",
            "app/other.py": "def go():\n    from .evals.cls import get_fn as g\n\n    g(abs)\n",
            "app/chain.py": "import app.evals.cls\nimport app.utils\n\napp.utils.get_fn(1)\n",
            "app/utils.py": "def get_fn(x):\n    return x\n",
        },
    )
    found = closed_uses_of(root)
    assert found.of("Evaluator") == Outside(called="in `common.py:8`", read="in `common.py:8`")
    # first named in `other.py` (a statement: its result unread), read in `train.py`
    assert found.of("get_fn") == Outside(called="in `other.py:4`", read="in `train.py:3`")
    assert found.of("unused") == Outside()
    (root / "app" / "train.py").write_text("x = 1\n")
    assert closed_uses_of(root).of("get_fn") == Outside(called="in `other.py:4`")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("from app.evals.cls import *\n", "in `user.py:1`"),
        ("from app.evals import *\n\ncls.get_fn()\n", "in `user.py:1`"),  # `__all__` may say cls
        ("import app.evals.cls as m\n\nprint(m)\n", "in `user.py:3`"),  # the module as a value
        ("import app.evals.cls\n\nf(app.evals)\n", "in `user.py:3`"),  # a package holding it
        ("import importlib\n\nm = [importlib.import_module(x)]\n", "in `user.py:3`"),
        ("from app.evals import cls\ndef f(:\n", "in `user.py`, which does not parse"),
        ("from app.evals.cls import get_fn\n", "in `user.py:1`"),  # bound for other modules
    ],
)
def test_a_closed_code_base_reading_the_module_otherwise_uses_every_function(
    tmp_path: Path, text: str, where: str
) -> None:
    root = closed_base(
        tmp_path, {"app/evals/cls.py": "def get_fn():\n    pass\n", "app/user.py": text}
    )
    assert closed_uses_of(root).of("get_fn") == Outside(called=where, read=where)


def test_a_dynamic_import_reads_the_module_by_its_name_after_binding_it(tmp_path: Path) -> None:
    user = (
        "import importlib\n\n\ndef load(name):\n"
        '    m = importlib.import_module("app.evals." + name)\n    return m.get_fn()\n\n\n'
        "def other(m):\n    return m.get_fn\n"  # another `m`: a parameter, not the module
    )
    root = closed_base(
        tmp_path, {"app/evals/cls.py": "def get_fn():\n    pass\n", "app/user.py": user}
    )
    assert closed_uses_of(root).of("get_fn") == Outside(
        called="in `user.py:6`", read="in `user.py:6`"
    )
    # a dynamic import of another package's modules names none of these
    (root / "app" / "user.py").write_text(user.replace('"app.evals." + name', 'f"app.pp.{name}"'))
    assert closed_uses_of(root).of("get_fn") == Outside()
    # an attribute of the module it returns, read at once, is that name's use alone
    chained = 'import importlib\n\nev = importlib.import_module("app.evals.cls").Evaluator()\n'
    (root / "app" / "user.py").write_text(chained)
    found = closed_uses_of(root)
    assert found.of("Evaluator") == Outside(called="in `user.py:3`", read="in `user.py:3`")
    assert found.of("get_fn") == Outside()


def test_a_code_base_not_declared_closed_may_be_imported_from_outside(tmp_path: Path) -> None:
    root = closed_base(tmp_path, {"app/evals/cls.py": "def get_fn():\n    pass\n"}, closed=False)
    found = Project().outside_uses(str(root / "app" / "evals" / "cls.py"))
    assert found is not None
    assert found.everywhere == (
        "from outside the code base maybe (`app.evals.cls` is in package `app`)"
    )


def test_a_private_function_is_used_where_the_code_base_imports_it(tmp_path: Path) -> None:
    # Not closed: anyone may import the module, so every public function counts as used from
    # outside; a private one only where a module of the code base names it.
    cls = "def get_fn():\n    pass\n\n\ndef _evaluate(p):\n    return p\n\n\ndef _alone():\n    pass\n"
    user = "from app.evals.cls import _evaluate\n\nx = _evaluate(1)\n"
    root = closed_base(tmp_path, {"app/evals/cls.py": cls, "app/user.py": user}, closed=False)
    found = Project().outside_uses(str(root / "app" / "evals" / "cls.py"))
    assert found is not None and found.everywhere
    assert found.of("get_fn").called == found.everywhere
    assert found.of("_evaluate") == Outside(called="in `user.py:1`", read="in `user.py:1`")
    assert found.of("_alone") == Outside()
    # the result cache's key holds that answer: a module importing `_alone` later changes it
    path = str(root / "app" / "evals" / "cls.py")
    before = Project().context(path, cls, callers=True)
    (root / "app" / "late.py").write_text("from app.evals.cls import _alone\n")
    assert Project().context(path, cls, callers=True) != before


def test_copies_seen_at_a_private_function_s_calls_count_the_code_base_s_calls(
    tmp_path: Path,
) -> None:
    # `main` passes `_evaluate` a replication, but `other.py` calls it too, with another value:
    # its parameter is not taken as the copies `main` passes (no `from_device_copies`).
    evaluate = (
        "import jax\nimport jax.numpy as jnp\nimport numpy as np\nfrom flax import jax_utils\n\n\n"
        "def _evaluate(params, seed):\n"
        "    flat = np.random.default_rng(seed).normal(size=(32, 4))\n"
        "    batch = flat.reshape((jax.local_device_count(), -1) + flat.shape[1:])\n"
        "    return p_step(params, batch)[0]\n\n\n"
        "def main():\n    return _evaluate(jax_utils.replicate(jnp.ones((4, 2))), 0)\n\n\n"
        'p_step = jax.pmap(lambda p, b: jax.lax.pmean(jnp.mean(b @ p), "i"), axis_name="i")\n'
    )
    other = "import jax.numpy as jnp\n\nfrom app.ev import _evaluate\n\n\n"
    other += "def other():\n    return _evaluate(jnp.ones((8, 4, 2)), 1)\n"
    root = closed_base(tmp_path, {"app/ev.py": evaluate}, closed=False)
    path = str(root / "app" / "ev.py")
    seen = migrate_source(evaluate, options=Options(unsafe_fixes=True), path=path)
    assert "params = from_device_copies(params)" in seen.code, [s.message for s in seen.sites]
    (root / "app" / "other.py").write_text(other)
    result = migrate_source(evaluate, options=Options(unsafe_fixes=True), path=path)
    assert "from_device_copies" not in result.code
    assert "[PL301] argument 1 of the step comes from elsewhere (`params`, a parameter of " in (
        result.sites[0].message
    )


def test_a_closed_code_base_file_that_does_not_parse_uses_only_what_it_may_import(
    tmp_path: Path,
) -> None:
    config = "config.evals.type = 'evals.cls'\ndef broken(:\n"  # big_vision's uvim config
    files = {"app/evals/cls.py": "def get_fn():\n    pass\n", "app/configs/a.py": config}
    assert closed_uses_of(closed_base(tmp_path, files)).of("get_fn") == Outside()
