"""Comparison by structure on real workers: false failures of real code, each pinned.

Each output here crosses two processes, so anything printed with an address (a function, a
jitted function, an object) differs between the sides although nothing changed: the verifier
must compare node types, keys, field names and functions by qualified name instead, and still
catch a wrong value or a changed static field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verify_cases import Case, module, verify_cases

from jaxmigrate.model import Status

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

VERIFIED, FAILED, UNVERIFIED = Status.VERIFIED, Status.FAILED, Status.UNVERIFIED

# A flax-TrainState-like pytree (flax is not needed): params are data, the optimizer's functions
# and the apply function are static fields, as `flax.struct.field(pytree_node=False)` makes them.
STATE = """
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple
from jax.experimental.pjit import pjit


class Transform(NamedTuple):
    init: Callable
    update: Callable


def sgd(lr):  # closures, as optax makes them: they travel by value between the workers
    def init(params):
        return ()

    def update(grads, state):
        return jax.tree.map(lambda g: -lr * g, grads), state

    return Transform(init, update)


def apply_fn(params, x):
    return x @ params["w"] + params["b"]


@partial(jax.tree_util.register_dataclass, data_fields=["step", "params"],
         meta_fields=["apply_fn", "tx", "tag"])
@dataclass
class TrainState:
    step: Any
    params: Any
    apply_fn: Callable = field(metadata=dict(static=True))
    tx: Transform = field(metadata=dict(static=True))
    tag: str = "s"


def make_state():
    params = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
    return TrainState(0, params, apply_fn, sgd(0.1))


def step(state, x):
    grads = jax.grad(lambda p: state.apply_fn(p, x).sum())(state.params)
    updates, _ = state.tx.update(grads, ())
    params = jax.tree.map(lambda p, u: p + SCALE * u, state.params, updates)
    return replace(state, step=state.step + 1, params=paramsTAG)


__jaxmigrate_examples__ = {"train_step": [(make_state(), np.ones((8, 4), np.float32))]}
"""
PJIT_STEP = "train_step = pjit(step, in_shardings=None, out_shardings=None)  # SITE\n"
JIT_STEP = "train_step = jax.jit(step)\n"


def state_module(define: str, scale: str = "1.0", tag: str = "") -> str:
    return module(STATE.replace("SCALE", scale).replace("TAG", tag) + "\n" + define)


# A factory: the target returns the jitted function it builds.
FACTORY = """
from jax.experimental.pjit import pjit


def make_step(scale):
    def body(x):
        return x * scale
    return {make}


__jaxmigrate_examples__ = {{"make_step": [(2.0,)]}}
"""

# Nested pmap on synthesized inputs: the original cannot run them (it needs 32 devices), only
# the vmap oracle can, and the rewrite's 2x4 mesh rejects them. Nothing is learnt about the
# rewrite from such inputs: unverified, not failed.
NESTED_SYNTH = module("""
def inner(v):
    return lax.psum(v, "j") + lax.psum(v, "i")


step = jax.pmap(jax.pmap(inner, axis_name="j"), axis_name="i")  # SITE
""")
NESTED_SYNTH_REWRITE = module("""
def inner(v):
    return lax.psum(v, "j") + lax.psum(v, "i")


mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("i", "j"))
step = jax.jit(jax.shard_map(lambda b: inner(b[0, 0])[None, None], mesh=mesh,
                             in_specs=P("i", "j"), out_specs=P("i", "j")))
""")

CASES = [
    Case(
        "train_state_static_functions",
        state_module(PJIT_STEP),
        state_module(JIT_STEP),
        VERIFIED,
        site_name="pjit",
    ),
    Case(
        "train_state_wrong_update",
        state_module(PJIT_STEP),
        state_module(JIT_STEP, scale="2.0"),
        FAILED,
        "outputs differ at output.params['b'] (float32[2]) of call 1: values differ: max abs err",
        site_name="pjit",
    ),
    Case(
        "train_state_static_field_changed",
        state_module(PJIT_STEP),
        state_module(JIT_STEP, tag=', tag="t"'),
        FAILED,
        "static data 't', expected 's'",
        site_name="pjit",
    ),
    Case(
        "factory_returns_a_jitted_function",
        module(FACTORY.format(make="pjit(body, in_shardings=None)  # SITE")),
        module(FACTORY.format(make="jax.jit(body)")),
        VERIFIED,
        "on 1 declared call(s) and 1 call(s) of the function it returns",
        site_name="pjit",
    ),
    Case(
        "factory_returns_a_wrong_function",
        module(FACTORY.format(make="pjit(body, in_shardings=None)  # SITE")),
        module(FACTORY.format(make="jax.jit(lambda x: body(x) + 1)")),
        FAILED,
        "of call 1 of the function the target returned: values differ",
        site_name="pjit",
    ),
    Case(
        "nested_pmap_synthesized",
        NESTED_SYNTH,
        NESTED_SYNTH_REWRITE,
        UNVERIFIED,
        "synthesized inputs that the original itself could not run",
    ),
]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return verify_cases(CASES, tmp_path_factory.mktemp("structure") / "project")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case(case: Case, verdicts: dict) -> None:
    verdict = verdicts[case.name]
    assert verdict.status is case.expect, f"{verdict.reason}\n{verdict.details}"
    assert case.reason in verdict.reason, verdict.reason


def test_static_functions_compare_by_qualified_name(verdicts: dict) -> None:
    verdict = verdicts["train_state_static_functions"]
    assert "not_comparable" not in verdict.details, verdict.details
    assert "0x" not in verdict.reason


def test_a_failure_text_is_not_cut(verdicts: dict, tmp_path: Path) -> None:
    reason = verdicts["train_state_static_field_changed"].reason
    assert reason.startswith("outputs differ at output of call 1: ")
    assert "TrainState" in reason and "..." not in reason
