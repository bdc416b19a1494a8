"""Real-code shapes of the program-level form: keyword arguments (flax's `p_train_step(state, batch,
dropout_rng=rngs)`), bodies nested in the function, stacked values read before the first call.

Keyword arguments are passed by position (`jax.shard_map` takes no keywords), with the reason
when the calls do not all fill the same parameters."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.verify.child.layouts import checked

HEAD = """\
import functools

import jax
import jax.numpy as jnp


def step(w, x, lr, scale=1.0):
    return w - lr * scale * jax.lax.pmean(x.mean(0) * w, "i")


def main(w, x, y):
    n = jax.local_device_count()
    lr = 0.1
    p_step = jax.pmap(functools.partial(step, lr=lr), axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
"""


def migrate(tail: str) -> tuple[str, list]:
    result = migrate_source(HEAD + tail, options=Options(unsafe_fixes=True))
    return result.code, result.sites


def test_keyword_arguments_are_passed_by_position() -> None:
    code, sites = migrate("    w = p_step(w, x=x)\n    return w[0]\n")
    assert "shard_map_per_device" not in code
    assert "w = p_step(w, x)\n" in code
    assert "lambda w, x: step(w, x=x, lr=lr)" in code
    assert any("keyword arguments passed by position" in s.message for s in sites)


REFUSED = {
    "calls filling other parameters": (
        "    w = p_step(w, x=x)\n    w = p_step(w, x)\n    return w[0]\n",
        "pass different arguments",
    ),
    "a value partial binds, bound again": (
        "    lr = 0.2\n    w = p_step(w, x=x)\n    return w[0]\n",
        "`lr`, which `partial` binds, is bound again",
    ),
    "a keyword argument pmap maps, not stacked": (
        "    w = p_step(w, x=x, scale=2.0)\n    return w[0]\n",
        "keyword argument `scale` of the step comes from elsewhere",
    ),
    "a keyword the body does not take": (
        "    w = p_step(w, x=x, momentum=0.9)\n    return w[0]\n",
        "a keyword the body does not take",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_keyword_shapes_say_why(case: str) -> None:
    tail, why = REFUSED[case]
    code, sites = migrate(tail)
    assert "shard_map_per_device(" in code
    (site,) = sites
    assert "program-level form not taken" in site.message and why in site.message, site.message


def test_verification_compares_calls_passing_keywords() -> None:
    """The original's calls with keyword arguments are kept in the flat layout too, in the
    order of the step's parameters (the rewrite passes them by position)."""
    layout = {"args": ["replicated", "batch"], "keywords": ["x"], "results": [0], "tuple": False}
    steps: list = []
    found: list[str] = []
    n = jax.local_device_count()
    step = checked(jax.pmap(lambda w, x: w + x.sum(), axis_name="i"), layout, "s", found, steps)
    w = np.broadcast_to(np.float32(1.0), (n,))
    step(w, x=np.ones((n, 3), np.float32))
    assert not found
    (call,) = steps
    assert len(call["arguments"]) == 2 and call["arguments"][1].shape == (n * 3,)


NESTED = """\
import jax
import jax.numpy as jnp


def main(w, x):
    n = jax.local_device_count()

    def step(a, b):
        return a - jax.lax.pmean(b.mean(0) * a * CLOSED, "i")

    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w = p_step(w, x)
    return w[0]
"""


def test_a_step_def_nested_in_the_function_is_taken() -> None:
    result = migrate_source(NESTED.replace("CLOSED", "2.0"), options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "jax.shard_map(" in result.code


def test_a_nested_body_reading_a_value_laid_out_anew_is_refused() -> None:
    """`x` is split for the step: the body closing over `x` would see the flat batch."""
    result = migrate_source(NESTED.replace("CLOSED", "x.sum()"), options=Options(unsafe_fixes=True))
    (site,) = result.sites
    assert "the body reads `x` of `main` itself" in site.message, site.message


STACKED_READ = """\
import jax
import jax.numpy as jnp


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i")


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    READ
    w = p_step(w, x)
    return w[0], seen
"""


@pytest.mark.parametrize(
    "read", ["seen = w.shape", "seen = (lambda v=w: v[1])()", "seen = [v for v in w]"]
)
def test_a_stacked_argument_read_before_the_first_call_is_refused(read: str) -> None:
    """`w` is stacked, then read, then fed to the step and bound to its result: the read
    between the stacking and the call sees the stacked value (here its device axis)."""
    code = STACKED_READ.replace("READ", read)
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    (site,) = result.sites
    assert "`w`, replicated for the step, is read other than passed" in site.message


def test_names_bound_to_each_other_end_the_device_count_search() -> None:
    """`a = b` and `b = a` (AlgoPerf's submissions rebind names so): no endless recursion."""
    code = STACKED_READ.replace("READ", "seen = 1\n    a = b\n    b = a")
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    assert "jax.shard_map(" in result.code
