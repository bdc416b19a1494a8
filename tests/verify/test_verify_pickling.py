"""Travelling values: local functions and lambdas are pickled by value (no workers needed)."""

from __future__ import annotations

import math
import pickle

from jaxmigrate.verify.child.pickling import dumps


def make_update(lr: float):
    def update(g: float) -> float:
        return -lr * g

    return update


def test_a_closure_travels_by_value() -> None:
    again = pickle.loads(dumps({"tx": (make_update(0.5), lambda x: x + 1)}))
    update, inc = again["tx"]
    assert update(4.0) == -2.0 and inc(1) == 2
    assert update.__qualname__ == "make_update.<locals>.update"


def test_a_function_of_a_module_the_receiver_cannot_import_brings_its_globals() -> None:
    namespace = {"__name__": "no_such_module_here", "math": math, "SCALE": 3}
    exec("model = lambda x: math.floor(x) * SCALE", namespace)  # noqa: S102 - a test module
    again = pickle.loads(dumps(namespace["model"]))
    assert again(2.5) == 6


def test_a_function_its_module_holds_wrapped_travels_by_value() -> None:
    # flax models hold the plain function under `jax.nn.relu`, a custom_jvp wrapper: pickle
    # refuses it ("not the same object as jax._src.nn.functions.relu")
    import jax
    import jax.numpy as jnp

    plain = jax.nn.relu.fun
    try:
        pickle.dumps(plain)
        refused = False
    except pickle.PicklingError:
        refused = True
    assert refused
    again = pickle.loads(dumps({"activation": plain}))["activation"]
    assert float(again(jnp.float32(-2.0))) == 0.0 and float(again(jnp.float32(3.0))) == 3.0
