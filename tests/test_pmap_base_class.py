"""A step a method decorator makes, called only by a base class in another module of the code
base (AlgoPerf's workloads: `@partial(jax.pmap, ...) def _eval_model(self, params, batch)` in
`cifar_jax/workload.py`, called as `self._eval_model(params, batch)` by
`BaseCifarWorkload._eval_model_on_split` in `cifar/workload.py`). The calls there are not
rewritten from the step's module, but they are read to name what blocks the program-level form;
with nothing blocking there, PL104 stands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import jm

BASE = """\
import jax
import numpy as np


class BaseWorkload:
    def eval_on_split(self, params, xs):
        total = 0.0
        for x in xs:
            batch = x.reshape((jax.local_device_count(), -1) + x.shape[1:])
            total += float(self._eval_model(params, batch)[0])
        return total
"""

STEP = """\
import functools

import jax

from app.base import BaseWorkload


class Workload(BaseWorkload):
    @functools.partial(
        jax.pmap, axis_name="batch", in_axes=(None, 0, 0), static_broadcasted_argnums=(0,)
    )
    def _eval_model(self, params, batch):
        return jax.lax.psum((batch @ params).sum(), axis_name="batch")
"""


def step_message(root: Path) -> str:
    proc = jm(
        "run", "--dry-run", "--no-verify", "--no-cache", "--select", "pmap", "--format", "json",
        "--target-jax", "0.8", ".", cwd=root,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    sites = [s for f in json.loads(proc.stdout)["files"] for s in f["sites"]]
    return next(s["message"] for s in sites if s["message"].startswith("`jax.pmap` ->"))


def code_base(tmp_path: Path, base: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.jaxmigrate]\nclosed-code-base = true\n'
    )
    for name, text in {"app/__init__.py": "", "app/base.py": base, "app/step.py": STEP}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_step_called_by_a_base_class_names_what_blocks_it_there(tmp_path: Path) -> None:
    message = step_message(code_base(tmp_path, BASE))
    called = "the step is a method of `Workload`, called by its base class `BaseWorkload`"
    assert f"[PL301] {called}" in message
    assert "(`params`, a parameter of `eval_on_split`)" in message


@pytest.mark.parametrize(
    "params",  # replicated there: nothing blocks, and the calls stay where they are
    ["jax.numpy.stack([jax.numpy.ones((4, 2))] * jax.local_device_count())"],
)
def test_with_nothing_blocking_in_the_base_class_its_calls_stay_unfollowed(
    tmp_path: Path, params: str
) -> None:
    base = BASE.replace("def eval_on_split(self, params, xs):", "def eval_on_split(self, xs):")
    base = base.replace(
        "        total = 0.0\n", f"        total = 0.0\n        params = {params}\n"
    )
    message = step_message(code_base(tmp_path, base))
    assert "[PL104] the step is made in a class body" in message
    assert "maybe in a base class" in message
