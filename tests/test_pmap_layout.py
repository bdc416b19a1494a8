"""The pmap rule's layout lattice and its table of transfers (`codemods/pmap/_layout.py`)."""

from __future__ import annotations

import libcst as cst
import pytest

from codemods.pmap._layout import (
    TRANSFERS,
    Layout,
    Role,
    lifted,
    match,
)
from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.scope import ScopeModel

IMPORTS = """\
import jax
import jax.numpy as jnp
import numpy as onp
from flax import jax_utils
from flax.training import common_utils as cu
"""


def expression(text: str) -> tuple[cst.BaseExpression, ScopeModel]:
    """Return the expression `text` at the end of a module importing the usual names."""
    module = cst.parse_module(IMPORTS + "n = jax.local_device_count()\n" + text + "\n")
    line = module.body[-1]
    assert isinstance(line, cst.SimpleStatementLine)
    node = line.body[0]
    assert isinstance(node, cst.Expr)
    return node.value, ScopeModel(module)


def counts(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "n"


# The lattice --------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(Layout))
def test_join_is_idempotent_and_has_nothing_as_its_unit(layout):
    assert layout.join(layout) is layout
    assert layout.join(Layout.NOTHING) is layout
    assert Layout.NOTHING.join(layout) is layout
    assert layout.join(Layout.UNKNOWN) is Layout.UNKNOWN


def test_two_known_layouts_join_to_unknown():
    assert Layout.REPLICAS.join(Layout.PER_DEVICE) is Layout.UNKNOWN
    assert Layout.HOST.join(Layout.REPLICAS) is Layout.UNKNOWN
    assert Layout.KEYS.join(Layout.PER_DEVICE) is Layout.UNKNOWN


def test_join_is_commutative_and_associative():
    layouts = list(Layout)
    for a in layouts:
        for b in layouts:
            assert a.join(b) is b.join(a)
            for c in layouts:
                assert a.join(b).join(c) is a.join(b.join(c))


STACKED = (Layout.REPLICAS, Layout.PER_DEVICE, Layout.KEYS)  # pmap's leading device axis


def test_every_row_parses_and_names_its_source_hole():
    for row in TRANSFERS:
        assert all("{" + row.source + "}" in p for p in row.patterns), row
        if row.role is Role.PRODUCER:
            assert row.gives in STACKED and row.takes not in STACKED, row
        if row.role is Role.CONSUMER:
            assert row.takes in STACKED and row.gives not in STACKED, row


@pytest.mark.parametrize(
    ("text", "name", "gives", "source"),
    [
        ("jax_utils.replicate(params)", "replicate", Layout.REPLICAS, "params"),
        ("jnp.broadcast_to(p, (n,) + p.shape)", "broadcast_to", Layout.REPLICAS, "p"),
        ("jnp.broadcast_to(p, (n, *p.shape))", "broadcast_to", Layout.REPLICAS, "p"),
        ("onp.stack([p] * n)", "stack", Layout.REPLICAS, "p"),
        ("jnp.repeat(p[None], n, axis=0)", "repeat", Layout.REPLICAS, "p"),
        (
            "jax.device_put_replicated(p, jax.local_devices())",
            "device_put_replicated",
            Layout.REPLICAS,
            "p",
        ),
        ("cu.shard(batch)", "shard", Layout.PER_DEVICE, "batch"),
        ("x.reshape((n, -1) + x.shape[1:])", "reshape", Layout.PER_DEVICE, "x"),
        ("x.reshape((n, -1, *x.shape[1:]))", "reshape", Layout.PER_DEVICE, "x"),
        ("x.reshape((n, x.shape[0] // n) + x.shape[1:])", "reshape", Layout.PER_DEVICE, "x"),
        # `(n, k)` reshapes only when `k` is the rows per device: the split, whatever `k` says
        ("x.reshape((n, 2) + x.shape[1:])", "reshape", Layout.PER_DEVICE, "x"),
        ("x.reshape((n, per_device) + x.shape[1:])", "reshape", Layout.PER_DEVICE, "x"),
        ("jax.random.split(rng, n)", "split", Layout.KEYS, "rng"),
        ("cu.shard_prng_key(rng)", "shard_prng_key", Layout.KEYS, "rng"),
        ("jax_utils.unreplicate(state)", "unreplicate", Layout.HOST, "state"),
        ("state.step[0]", "index", Layout.HOST, "state.step"),
        ("cu.get_metrics(metrics)", "get_metrics", Layout.HOST, "metrics"),
        ("jax_utils.prefetch_to_device(it, 2)", "prefetch_to_device", Layout.PER_DEVICE, "it"),
    ],
)
def test_a_spelling_matches_its_row(text, name, gives, source):
    node, names = expression(text)
    found = match(node, names.qualified_name, counts)
    assert found is not None and found.row.name == name
    assert found.row.gives is gives
    assert code(found.source) == source


@pytest.mark.parametrize(
    "text",
    [
        "jnp.broadcast_to(p, (4,) + p.shape)",  # another number than the local devices
        "jnp.broadcast_to(p, (n,) + q.shape)",  # the shape of another value
        "x.reshape((n, -1) + y.shape[1:])",
        "x.reshape((n, f(x)) + x.shape[1:])",  # a call the rewrite would drop
        "jax.random.split(rng, 4)",
        "jax.random.split(rng)",
        "x[1]",
        "replicate(params)",  # a name of the module's own, not flax's
        "np.stack([p] * n)",  # `np` is not imported here
    ],
)
def test_other_spellings_match_no_row(text):
    node, names = expression(text)
    assert match(node, names.qualified_name, counts) is None


def test_names_are_resolved_by_meaning():
    module = cst.parse_module(
        "from flax.jax_utils import replicate as rep\nimport flax.training.common_utils\n"
        "rep(p)\nflax.training.common_utils.shard(b)\n"
    )
    names = ScopeModel(module)
    values = [line.body[0].value for line in module.body[2:]]
    assert [match(v, names.qualified_name).row.name for v in values] == ["replicate", "shard"]


def test_tree_map_lifts_a_row_leaf_by_leaf():
    node, names = expression("jax.tree.map(lambda v: v.reshape((n, -1) + v.shape[1:]), batch)")
    found = lifted(node, names.qualified_name, counts)
    assert found is not None and found.lifted and found.row.name == "reshape"
    assert code(found.source) == "batch"
    node, names = expression("jax.tree.map(lambda v: v[0], state)")
    found = lifted(node, names.qualified_name, counts)
    assert found is not None and found.row.gives is Layout.HOST


def test_tree_map_of_a_leaf_read_elsewhere_is_not_lifted():
    node, names = expression("jax.tree.map(lambda v: jnp.broadcast_to(v, (v.size,) + v.shape), p)")
    assert lifted(node, names.qualified_name, lambda _: True) is None
    node, names = expression("jax.tree.map(lambda v, w: v[0], a, b)")
    assert lifted(node, names.qualified_name, counts) is None


def test_a_row_rewrites_through_its_template():
    node, names = expression("cu.shard({'x': x, 'y': y})")
    found = match(node, names.qualified_name, counts)
    assert found is not None
    context = {"jax": cst.Name("jx"), "sharding": cst.Name("batch_sharding")}
    assert code(found.rewrite(context)) == (
        "jx.make_array_from_process_local_data(batch_sharding, {'x': x, 'y': y})"
    )
    node, names = expression("jax_utils.replicate(state)")
    assert code(match(node, names.qualified_name).rewrite({})) == "state"
    node, names = expression("cu.get_metrics(train_metrics)")
    found = match(node, names.qualified_name)
    assert code(found.rewrite({"jax": cst.Name("jax")})) == (
        "cu.stack_forest(jax.device_get(train_metrics))"
    )
