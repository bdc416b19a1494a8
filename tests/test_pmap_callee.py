"""A step passed to a def of the module (flax's `evaluate(p_eval_step=...)`) or called in a nested
function (brax's `training_epoch_with_timing`) is followed there (`codemods/pmap/_callee.py`);
each case here is one where following it must not take the program-level form, and the message
says which value blocks it."""

from __future__ import annotations

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

PROGRAM = """\
import jax
import jax.numpy as jnp
from flax import jax_utils
from flax.training import common_utils


def train_step(params, batch):
    grads = jax.grad(lambda p: jnp.mean((batch @ p) ** 2))(params)
    return params - 0.1 * jax.lax.pmean(grads, "batch")


def eval_step(params, batch):
    return jax.lax.psum(jnp.sum(batch @ params), "batch")


def evaluate(p_eval_step, params, batches):
    total = 0.0
    for batch in batches:
        total += p_eval_step(params, common_utils.shard(batch))[0]
    return total


def run(w, batches):
    params = jax_utils.replicate(w)
    p_train_step = jax.pmap(train_step, axis_name="batch")
    p_eval_step = jax.pmap(eval_step, axis_name="batch")
    for batch in batches:
        params = p_train_step(params, common_utils.shard(batch))
    return evaluate(p_eval_step, params, batches), jax_utils.unreplicate(params)
"""


def messages(source: str) -> dict[str, str]:
    """The pmap sites' messages, by the name the step is bound to."""
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    lines = source.splitlines()
    found = {}
    for site in result.sites:
        if site.message.startswith("`jax.pmap` ->"):
            found[lines[site.line - 1].split("=")[0].strip()] = site.message
    return found


def test_the_program_takes_the_program_level_form() -> None:
    found = messages(PROGRAM)
    assert all("(program-level)" in m for m in found.values()), found
    assert set(found) == {"p_train_step", "p_eval_step"}


def test_a_def_called_twice_is_not_followed() -> None:
    source = PROGRAM.replace(
        "    return evaluate(p_eval_step, params, batches), ",
        "    evaluate(p_eval_step, params, batches)\n"
        "    return evaluate(p_eval_step, params, batches), ",
    )
    found = messages(source)
    assert (
        "[PL201] `p_eval_step` is used other than called: passed to `evaluate(...)`"
        in (found["p_eval_step"])
    )
    assert "[PL303] `params`, replicated for the step" in found["p_train_step"]


def test_a_def_holding_a_pmap_is_not_followed() -> None:
    source = PROGRAM.replace(
        "    total = 0.0\n", "    total = 0.0\n    jax.pmap(lambda x: x, axis_name='j')\n"
    )
    assert "[PL201] `p_eval_step` is used other than called" in messages(source)["p_eval_step"]


def test_a_stacked_value_the_def_reads_itself_blocks_the_other_step() -> None:
    """The train step's replicated params passed to the def it hands the eval step to: only a
    parameter the def passes on to that step is the eval step's to lay out."""
    source = PROGRAM.replace(
        "def evaluate(p_eval_step, params, batches):\n    total = 0.0\n",
        "def evaluate(p_eval_step, params, batches, copies):\n    total = 0.0 + len(copies)\n",
    ).replace(
        "evaluate(p_eval_step, params, batches), ",
        "evaluate(p_eval_step, params, batches, params), ",
    )
    found = messages(source)
    assert (
        "[PL303] `params`, replicated for the step, is read other than passed to it"
        in (found["p_train_step"])
    ), found


def test_an_argument_of_the_caller_names_where_it_comes_from() -> None:
    source = PROGRAM.replace(
        "return evaluate(p_eval_step, params, batches), ",
        "return evaluate(p_eval_step, w, batches), ",
    )
    assert (
        "[PL301] `p_eval_step` is passed to `evaluate`, where argument 1 of the step comes from "
        "elsewhere (`w`, a parameter of `run`)"
    ) in messages(source)["p_eval_step"]


def test_a_nested_function_called_before_the_step_is_made_is_not_followed() -> None:
    source = """\
import jax


def total(x):
    return jax.lax.psum(x, "i")


def train(xs):
    def run(values):
        return step(values)[0]

    step = jax.pmap(total, axis_name="i")
    return run(jax.device_put_replicated(xs, jax.local_devices()))
"""
    assert "[PL203] `step` is called in a nested function `run`" in messages(source)["step"]


def test_a_def_calling_a_module_step_is_not_followed() -> None:
    """Its calls of the module's step are that step's program (edited with the mesh the program
    sets): one def is rewritten by one of them only."""
    source = PROGRAM.replace(
        "def evaluate(p_eval_step, params, batches):\n    total = 0.0\n",
        "def evaluate(p_eval_step, params, batches):\n    total = p_sum(jnp.ones(8))[0]\n",
    ).replace(
        "def run(w, batches):",
        "@functools.partial(jax.pmap, axis_name='batch')\n"
        "def p_sum(x):\n    return jax.lax.psum(x, 'batch')\n\n\ndef run(w, batches):",
    )
    source = "import functools\n" + source
    found = migrate_source(source, options=Options(unsafe_fixes=True))
    step = next(s for s in found.sites if "p_eval_step = " in source.splitlines()[s.line - 1])
    assert "[PL201] `p_eval_step` is used other than called" in step.message, step.message
