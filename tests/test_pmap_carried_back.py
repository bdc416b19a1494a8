"""State a def the step is passed to (or a nested def calling it) returns to its caller
(`_callee.carried_back`): the caller follows it as the step's result, fed back and read back;
around the fixture `program_state_returned_by_callee`, the shapes where it must not, each
saying which value blocks and why (PL401)."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

TAKEN = (FIXTURES / "pmap" / "program_state_returned_by_callee.py").read_text()
NESTED = (FIXTURES / "pmap" / "program_state_returned_by_nested_def.py").read_text()


def step_message(source: str) -> str:
    result = migrate_source(source, options=Options())
    return next(s.message for s in result.sites if s.message.startswith("`jax.pmap` ->"))


@pytest.mark.parametrize("source", [TAKEN, NESTED], ids=["passed to a def", "nested def"])
def test_the_fixtures_take_it(source: str) -> None:
    assert "(program-level)" in step_message(source)


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (  # one path returns the parameter as it came: the caller gave it, it is the same
            "    losses = []\n",
            "    losses = []\n    if not batches:\n        return params, 0.0\n",
            None,
        ),
        (  # one path returns another value: what the caller binds is not the step's result
            "    losses = []\n",
            "    losses = []\n    if not batches:\n        return np.zeros((3, 1)), 0.0\n",
            (
                "[PL301] `p_train_step` is passed to `train_epoch`, where argument 1 of the step "
                "comes from elsewhere (`params`, unpacked from `train_epoch(p_train_step, params, batches)`)"
            ),
        ),
        (  # the caller binds the pair whole, then takes it apart
            "        params, loss = train_epoch(p_train_step, params, batches)\n",
            "        out = train_epoch(p_train_step, params, batches)\n        params, loss = out\n",
            (
                "[PL301] `p_train_step` is passed to `train_epoch`, where argument 1 of the step "
                "comes from elsewhere (`params`, unpacked from `out`)"
            ),
        ),
        (  # the caller reads it other than as device 0's copy or fed back
            "        history.append(loss)\n",
            "        history.append(loss)\n        print(params.shape)\n",
            (
                "[PL401] `p_train_step` is passed to `train_epoch`, where `params`, a result of "
                "`p_train_step`, is read other than as `params[0]`"
            ),
        ),
    ],
    ids=["parameter returned", "other value returned", "bound whole", "read otherwise"],
)
def test_state_carried_back(old: str, new: str, why: str | None) -> None:
    assert old in TAKEN
    message = step_message(TAKEN.replace(old, new, 1))
    if why is None:
        assert "(program-level)" in message, message
        return
    assert f"program-level form not taken: {why}" in message, message


def test_a_def_whose_result_is_not_read_returns_it_as_it_is() -> None:
    """`train_epoch(...)` as a statement: what it returns is read by nobody."""
    old = "        params, loss = train_epoch(p_train_step, params, batches)\n        history.append(loss)\n"
    assert old in TAKEN
    source = TAKEN.replace(old, "        train_epoch(p_train_step, params, batches)\n", 1)
    assert "(program-level)" in step_message(source)
