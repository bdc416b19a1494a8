"""Which results of a pmapped body the program-level form reads as one replicated value (`P()`).

The body analysis must be sound: a result that may differ between devices is never given
`out_specs=P()` (that would silently read device 0's value only). Each body below returns
`new_w, out` with `out` read as `out[0]` by the program; the program-level form is taken only
when `out` is the same on every device, and otherwise the faithful form is kept with the reason.
The positive shapes are executed on 8 devices by the fixture pairs
(tests/fixtures/pmap/program_*.py); these check the refusals through the real engine.
"""

from __future__ import annotations

import textwrap

import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

PROGRAM = """\
import jax
import jax.numpy as jnp

SETTING = True
SCALE = None  # a flax DynamicScale in the program


def tagged(x):
    return x + jax.lax.axis_index("i")


def cross_mean(t):
    return jax.lax.pmean(t, "i")


def other_mean(t, axis="j"):
    return jax.lax.pmean(t, axis)


def mean_and(t, u):
    return jax.lax.pmean(t, "i"), u


def total(t):
    return t.sum()


def fill(out, t):
    out["a"] = t


def fill_through(out, t):
    fill(out, t)


def own_box(t, u):
    box = {{}}
    box["t"] = t
    return u


def step(w, x):
{body}


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w, out = p_step(w, x)
    return w[0], out[0]
"""
GRAD = """\
g = jax.lax.pmean(jax.grad(lambda v: jnp.sum(x @ v))(w), "i")
new_w = w - 0.1 * g
"""

SAME = {
    "a pmean": "out = jax.lax.pmean(x.sum(), 'i')",
    "a dict of pmeans": "out = {'a': jax.lax.pmean(x.sum(), 'i'), 'b': jax.lax.psum(1, 'i')}",
    "a nested loss with aux": """\
def loss_fn(v):
    y = x @ v
    return jnp.sum(y), y

(loss, y), g = jax.value_and_grad(loss_fn, has_aux=True)(w)
g = jax.lax.pmean(g, axis_name="i")
new_w = w - 0.1 * g
out = jax.lax.pmean(loss, axis_name="i")
return new_w, out""",
    "from replicated values only": "out = jnp.sum(w) * 2",
    "reduced on both branches": """\
if SETTING:
    out = jax.lax.pmean(x.sum(), "i")
else:
    out = jax.lax.pmax(x.sum(), "i")""",
    "an all_gather": "out = jax.lax.all_gather(x.sum(), 'i')",
    "a tuple of axes with the step's": "out = jax.lax.pmean(x.sum(), ('i',))",
    "a module helper's pmean": "out = cross_mean(x.sum())",
    "a tree map reducing the leaves that differ": (
        "out = jax.tree.map(lambda v, g: v - 0.1 * jax.lax.pmean(g, 'i'), w, x)"
    ),
    "a module helper's pmean, passed by keyword": "out = cross_mean(t=x.sum())",
    "a module helper's result from replicated values": "out = mean_and(x.sum(), jnp.sum(w))",
    "a dict filled by a module helper with a pmean": "out = {}\nfill(out, cross_mean(x.sum()))",
    # `own_box` stores only into a dict of its own: what it is passed is not changed
    "passed with the batch to a module helper filling a dict of its own": (
        "out = jnp.sum(w)\nown_box(x.sum(), out)"
    ),
    "a per-device value's shape, one trace's": "out = jnp.zeros(x.shape[1:]).sum() + x.ndim",
    "a dict filled through an alias with a pmean": "out = {}\nb = out\nb['a'] = cross_mean(x.sum())",
    "a dict filled by a closure with a pmean": """\
out = {}

def log(name, v):
    out[name] = v

log("loss", jax.lax.pmean(x.sum(), "i"))""",
    "the part of a tuple that is the same": "pair = (jax.lax.pmean(x.sum(), 'i'), x.sum())\nout = pair[0]",
    "a nested tuple unpacked": "(out, b), c = (jnp.sum(w), x.sum()), x.sum()",
    "a closure's part that is the same": (
        "def f(v):\n    return jnp.sum(w) * v, x.sum()\n\nout, _ = f(2.0)"
    ),
    "a part the same on both branches": """\
pair = (jnp.sum(w), x.sum())
if SETTING:
    pair = (jnp.sum(w) * 2, x.sum())
out = pair[0]""",
    "an aux part the same, through value_and_grad": """\
def loss_fn(v):
    y = x @ v
    return jnp.sum(y), (jnp.sum(w), y)

grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
aux, g = grad_fn(w)
g = jax.lax.pmean(g, "i")
new_w = w - 0.1 * g
out, y = aux[1]
return new_w, out""",
    "a DynamicScale's grads, new scale and finite check over the step's axis": """\
grad_fn = SCALE.value_and_grad(lambda v: jnp.sum(x @ v), axis_name="i")
scale, finite, loss, g = grad_fn(w)
new_w = jnp.where(finite, w - 0.1 * g, w)
out = scale""",
}
SCALED = """\
grad_fn = SCALE.value_and_grad(lambda v: jnp.sum(x @ v), axis_name="i")
scale, finite, loss, g = grad_fn(w)
new_w = w
"""

DIFFERENT = {
    "a per-device sum": "out = x.sum()",
    "reduced over another axis": "out = jax.lax.pmean(x.sum(), 'j')",
    "reduced in groups": "out = jax.lax.psum(x.sum(), 'i', axis_index_groups=[[0, 1]])",
    "reduced over an axis named by a variable": "axis = 'i'\nout = jax.lax.pmean(x.sum(), axis)",
    "reduced on one branch only": "out = x.sum()\nif SETTING:\n    out = jax.lax.pmean(out, 'i')",
    "an axis_index": "out = jax.lax.axis_index('i') * jnp.sum(w)",
    "a module function using axis_index": "out = tagged(jnp.sum(w))",
    "a module helper not reducing": "out = total(x)",
    "a tree map reducing the leaves the same already": (
        "out = jax.tree.map(lambda v, g: jax.lax.pmean(v, 'i') - 0.1 * g, w, x)"
    ),
    "a tree map not reducing the leaves that differ": (
        "out = jax.tree.map(lambda v, g: v - 0.1 * g, w, x)"
    ),
    "a module helper reducing over an axis it is passed": "out = other_mean(x.sum(), 'i')",
    "a module helper returning a per-device value too": "out = mean_and(x.sum(), x.sum())",
    "a module helper called with a star": "out = cross_mean(*[x.sum()])",
    "a dict filled per device by a module helper": "out = {}\nfill(out, x.sum())",
    "a dict filled per device two helpers deep": "out = {}\nfill_through(out, x.sum())",
    "a dict filled per device by a helper in an assignment": "out = {}\n_ = fill(out, x.sum())",
    "a dict passed by keyword to a module helper filling it": "out = {}\nfill(t=x.sum(), out=out)",
    # a module helper passed on: `out` was read as the same on every device
    "a dict passed with a module helper filling it per device": (
        "out = {'a': jnp.sum(w)}\nlist(map(fill, [out], [x.sum()]))"
    ),
    "a closure reading the batch": "def f(v):\n    return jnp.sum(x) * v\n\nout = f(jnp.sum(w))",
    "a closure reading a name bound later": """\
def f(v):
    return later * v

later = jnp.sum(w)
out = f(1.0)
later = x.sum()
out = f(out)""",
    "a loop carrying the batch": """\
out = jnp.sum(w)
acc = jnp.sum(w)
for _ in range(2):
    out = acc
    acc = x.sum()""",
    "a dict with one per-device entry": "out = {'a': jax.lax.pmean(x.sum(), 'i'), 'b': x.sum()}",
    "a dict filled per device": "out = {}\nout['a'] = x.sum()",
    "a list appended per device": "out = []\nout.append(x.sum())",
    # a store into an object another name holds too: `out` was read as the same on every device
    "a dict filled per device through an alias": "out = {'a': jnp.sum(w)}\nb = out\nb['a'] = x.sum()",
    "a dict updated per device through an alias": "out = {}\nb, c = out, 1\nb.update(a=x.sum())",
    "a list in a dict appended per device": "inner = []\nout = {'l': inner}\ninner.append(x.sum())",
    "a dict of a list filled per device in a loop": "out = [{}]\nfor d in out:\n    d['a'] = x.sum()",
    "an entry got and filled per device": "out = {'d': {}}\nout.get('d')['a'] = x.sum()",
    "an entry set by default and appended": "out = {}\nout.setdefault('l', []).append(x.sum())",
    # a closure storing into the body's objects: `out` was read as the same on every device
    "a dict filled per device by a closure": """\
out = {}

def log(name, v):
    out[name] = v

log("loss", x.sum())""",
    "a dict passed to a closure filling it per device": """\
out = {}

def fill_in(d, v):
    d["a"] = v

fill_in(out, x.sum())""",
    "a dict passed with a closure filling it per device": """\
out = {"a": jnp.sum(w)}

def fill(d):
    d["a"] = x.sum()

list(map(fill, [out]))""",
    "a dict filled per device by a closure through a name of its own": """\
out = {}

def log(k, v):
    m = out
    m[k] = v

log("loss", x.sum())""",
    "a list appended by a closure reading the batch": """\
out = []

def add():
    out.append(x.sum())

add()""",
    "a dict filled by a closure passed on, its arguments not seen": """\
out = {}

def put(v):
    out["a"] = v

jax.tree.map(put, jnp.sum(w))""",
    "the part of a tuple that differs": "pair = (jax.lax.pmean(x.sum(), 'i'), x.sum())\nout = pair[1]",
    "a part that differs on one branch": """\
pair = (jnp.sum(w), x.sum())
if SETTING:
    pair = (x.sum(), jnp.sum(w))
out = pair[0]""",
    "a part carried through a loop": """\
pair = (jnp.sum(w), jnp.sum(w))
for _ in range(2):
    pair = (pair[1], x.sum())
out = pair[0]""",
    "an aux part that differs, through value_and_grad": """\
def loss_fn(v):
    y = x @ v
    return jnp.sum(y), (jnp.sum(w), y.sum())

aux, g = jax.value_and_grad(loss_fn, has_aux=True)(w)
g = jax.lax.pmean(g, "i")
new_w = w - 0.1 * g
same, out = aux[1]
return new_w, out""",
    "an aux read whole, through value_and_grad": """\
def loss_fn(v):
    return jnp.sum(x @ v), (jnp.sum(w), x.sum())

(loss, out), g = jax.value_and_grad(loss_fn, has_aux=True)(w)
new_w = w - 0.1 * jax.lax.pmean(g, "i")
return new_w, out""",
    "a permutation": "out = jax.lax.ppermute(jnp.sum(w), 'i', [(0, 1), (1, 0)])",
    "a mutated field": "out = {'a': jnp.sum(w)}\nout['a'] += x.sum()",
    "a per-device value's shape and values": "out = jnp.zeros(x.shape[1:]).sum() + x.sum()",
    "a DynamicScale's value": SCALED + "out = loss",
    "a DynamicScale reducing over another axis": SCALED.replace('"i"', '"j"') + "out = g",
    "a DynamicScale of per-device data": SCALED.replace("SCALE", "x") + "out = scale",
    "a DynamicScale bound on one path only": """\
grad_fn = jax.value_and_grad(lambda v: jnp.sum(x @ v))
if SETTING:
    grad_fn = SCALE.value_and_grad(lambda v: jnp.sum(x @ v), axis_name="i")
scale, finite, loss, g = grad_fn(w)
new_w = w
out = g""",
}


def program(body: str) -> str:
    if not any(line.startswith("return") for line in body.splitlines()):
        body = GRAD + body + "\nreturn new_w, out"
    return PROGRAM.format(body=textwrap.indent(body, "    "))


def run(body: str) -> tuple[str, str]:
    result = migrate_source(program(body), options=Options(unsafe_fixes=True))
    main_site = next(s for s in result.sites if "`jax.pmap`" in s.message)
    return result.code, main_site.message


@pytest.mark.parametrize("case", sorted(SAME))
def test_results_the_same_on_every_device_take_the_program_form(case: str) -> None:
    code, message = run(SAME[case])
    assert "program-level" in message and "not taken" not in message, message
    assert "out_specs=(P(), P())" in code


@pytest.mark.parametrize("case", sorted(DIFFERENT))
def test_results_that_may_differ_keep_the_faithful_form(case: str) -> None:
    code, message = run(DIFFERENT[case])
    assert "shard_map_per_device(" in code and "out_specs=(P(), P())" not in code
    assert "program-level form not taken" in message and "`out`" in message, message


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("try:\n    out = x.sum()\nexcept ValueError:\n    out = 0\nreturn w, out", "`Try`"),
        ("if SETTING:\n    return w, jnp.sum(w)\nreturn w, jnp.sum(w)\nw = w", "end in a return"),
        ("global G\nout = jnp.sum(w)\nreturn w, out", "`Global`"),
        ("out = jnp.sum(w)\nif SETTING:\n    return w, out\nelse:\n    return w", "shape"),
    ],
)
def test_bodies_not_followed_say_why(body: str, why: str) -> None:
    _, message = run(body)
    assert "program-level form not taken" in message and why in message, message


READS = {
    "the shape of a result": ("n_out = out.shape[0]", False),
    "device 1's copy": ("o = out[1][0]", False),
    "a transposed result": ("o = out.T[0]", False),
    "a field of a result": ("o = out['a'][0]", True),
    "a fetched result": ("o = jax.device_get(out)[0]", True),
}


@pytest.mark.parametrize("case", sorted(READS))
def test_only_device_0_reads_are_readbacks(case: str) -> None:
    read, taken = READS[case]
    body = "out = {'a': jax.lax.pmean(x.sum(), 'i')}"
    source = program(body).replace("    return w[0], out[0]\n", f"    {read}\n    return w[0], o\n")
    source = source.replace("n_out = ", "o = ")
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert ("shard_map_per_device(" not in result.code) is taken, result.code


def test_a_local_name_shadowing_a_module_helper_is_not_the_helper() -> None:
    body = "cross_mean = lambda t: t\nout = cross_mean(x.sum())"
    code, message = run(body)
    assert "shard_map_per_device(" in code and "program-level form not taken" in message, message
