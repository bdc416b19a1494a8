"""A step whose batch statistics its model's batch norms average over the step's axis.

flax's imagenet example trains a ResNet made with `partial(nn.BatchNorm, ..., axis_name="batch")`
in `models.py`: the statistics `state.apply_fn(..., mutable=["batch_stats"])` updates are the
same on every device, so the state the step returns is, and `sync_batch_stats(state)` before
each evaluation is its value itself. `_body.averaged_axes` reads that fact from every
`BatchNorm` the step's module and the code base's modules it imports name; any one it cannot
read (no literal axis, a class passed on as a value, a `batch_stats` variable made by hand)
leaves the statistics per device, and the step's result is then averaged after it (PL402). The
program itself runs before and after on 8 devices as the fixture pair
`program_batch_norm_over_the_axis` (and `decline_pl402_batch_norm_per_device`).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from clitools import jm

from codemods.pmap._body import averaged_axes

FIXTURES = Path(__file__).parent / "fixtures" / "pmap"

NORMS = {
    "bound by partial": (
        'norm = partial(nn.BatchNorm, momentum=0.9, axis_name="batch")',
        {"batch"},
    ),
    "made where used": (
        'x = nn.BatchNorm(use_running_average=False, axis_name="batch")(x)',
        {"batch"},
    ),
    "imported by name": (
        'from flax.linen import BatchNorm\nx = BatchNorm(axis_name="i")(x)',
        {"i"},
    ),
    "no axis": ("x = nn.BatchNorm(use_running_average=False)(x)", set()),
    "an axis not literal": ("x = nn.BatchNorm(axis_name=AXIS)(x)", set()),
    "averaged in groups": ('x = nn.BatchNorm(axis_name="i", axis_index_groups=[[0, 1]])(x)', set()),
    "one of two without": ('a = nn.BatchNorm(axis_name="batch")\nb = nn.BatchNorm()', set()),
    "two axes": ('a = nn.BatchNorm(axis_name="a")\nb = nn.BatchNorm(axis_name="b")', {"a", "b"}),
    "passed on as a value": ('norm: Any = nn.BatchNorm\nx = norm(axis_name="batch")(x)', set()),
    "a subclass": ('class Norm(nn.BatchNorm):\n    axis_name: str = "batch"', set()),
    "statistics of its own": (
        'x = nn.BatchNorm(axis_name="batch")(x)\nm = self.variable("batch_stats", "m", f)',
        set(),
    ),
    "none at all": ("x = nn.Dense(3)(x)", set()),
}


@pytest.mark.parametrize("case", sorted(NORMS))
def test_the_axes_every_batch_norm_averages_over(case: str) -> None:
    source, axes = NORMS[case]
    assert averaged_axes([cst.parse_module(source + "\n")]) == axes


def test_every_module_read_must_say_its_axis() -> None:
    said = cst.parse_module('x = nn.BatchNorm(axis_name="batch")(x)\n')
    unsaid = cst.parse_module("x = nn.BatchNorm()(x)\n")
    assert averaged_axes([said, said]) == {"batch"}
    assert averaged_axes([said, unsaid]) == set()


MODELS = """\
from functools import partial

from flax import linen as nn


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, {axis})
        return nn.Dense(3)(nn.relu(norm()(nn.Dense(8)(x))))
"""


def project(tmp_path: Path, axis: str) -> Path:
    """flax imagenet's layout: `train.py` (the fixture's steps, its model made in `models.py`)
    beside `models.py`, as a script folder."""
    source = (FIXTURES / "program_batch_norm_over_the_axis.py").read_text()
    head, _, rest = source.partition("class Net(nn.Module):")
    _, _, rest = rest.partition("class TrainState(")
    train = head + "import models\n\n\nclass TrainState(" + rest.replace("Net()", "models.Net()")
    (tmp_path / "train.py").write_text(train)
    (tmp_path / "models.py").write_text(MODELS.format(axis=axis))
    return tmp_path


def step_messages(folder: Path) -> list[str]:
    report = folder.parent / f"{folder.name}.json"
    run = ("run", "--dry-run", "--no-verify", "--no-cache", "--select", "pmap", "--report")
    proc = jm(*run, str(report), "--format", "json", ".", cwd=folder)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    files = {Path(f["path"]).name: f for f in json.loads(report.read_text())["files"]}
    sites = files["train.py"]["sites"]
    return [s["message"] for s in sites if s["message"].startswith("`jax.pmap` ->")]


def test_a_model_module_averaging_its_statistics_lets_the_steps_drop_the_device_axis(
    tmp_path: Path,
) -> None:
    messages = step_messages(project(tmp_path, 'axis_name="batch"'))
    steps = [m for m in messages if "(program-level)" in m and "deleted with" not in m]
    assert len(steps) == 2, messages
    # the mean `sync_batch_stats` called, its only reader gone: deleted with the program
    assert any("deleted with `cross_replica_mean` (program-level)" in m for m in messages)
    said = (
        'the batch statistics `state.apply_fn(..., mutable=["batch_stats"])` updates are the same'
    )
    assert said in steps[0] and 'averages them over "batch"' in steps[0], steps[0]


@pytest.mark.parametrize("axis", ["", 'axis_name="other"'])
def test_a_model_module_keeping_its_statistics_per_device_blocks_them(
    tmp_path: Path, axis: str
) -> None:
    messages = step_messages(project(tmp_path, axis))
    assert not any("(program-level)" in m for m in messages), messages
    assert any("[PL402] `state`" in m and "sync_batch_stats(state)" in m for m in messages), (
        textwrap.shorten(" | ".join(messages), 2000)
    )
