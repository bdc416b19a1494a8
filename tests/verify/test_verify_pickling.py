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
