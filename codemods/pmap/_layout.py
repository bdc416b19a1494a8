"""What a value around a pmapped step is laid out as, and what each known function does to that.

A pmap program moves values between two worlds: the host (one value) and the device axis pmap
maps (a leading axis of one entry per local device). The program-level form removes that axis:
a value stacked as equal copies becomes one global value replicated on the mesh (`P()`), a value
stacked as per-device slices becomes one global value sharded over the axis (`P(axis)`), and the
functions that moved values between the worlds (`replicate`, `shard`, `x[0]`, ...) go.

`Layout` is the lattice (a flat one: no information below, `UNKNOWN` above, the known layouts
between, with a join). Each argument of a step is laid out by joining the layouts of the values
that reach its calls (`_flow._follow_argument`: a result fed back and a replication are both
`REPLICAS`; a batch on one path and copies on another join to `UNKNOWN`, PL302); `TRANSFERS` is the table of what each known producer and consumer does,
one row each, with its spelling as a pattern and its program-level rewrite as a template (both
libcst templates: `{x}` is a hole). `match` reads one expression against the table.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_expression

from jaxmigrate.toolkit.cstutil import names_in
from jaxmigrate.toolkit.names import child_fields, dotted

Qualname = Callable[[cst.BaseExpression], "str | None"]
Holes = dict[str, cst.BaseExpression]  # what each hole of a pattern holds, by name
Counts = Callable[[cst.BaseExpression], bool]  # is this the number of local devices?


class Layout(enum.Enum):
    """How one value is laid out: on the host, stacked over the device axis, or global."""

    NOTHING = "no value yet"  # the lattice's bottom: not bound on any path seen
    HOST = "a host value"
    REPLICAS = "stacked replicas"  # a leading device axis holding equal copies
    PER_DEVICE = "stacked per-device data"  # a leading device axis of different slices
    KEYS = "per-device keys"  # a leading device axis of different PRNG keys
    REPLICATED = "global, replicated (`P()`)"
    SHARDED = "global, sharded over the axis (`P(axis)`)"
    UNKNOWN = "unknown"  # the top: from outside the code base, or two layouts on two paths

    def join(self, other: Layout) -> Layout:
        """Return the least layout above both: the layout after two paths meet."""
        if self is other or other is Layout.NOTHING:
            return self
        if self is Layout.NOTHING:
            return other
        return Layout.UNKNOWN


class Role(enum.Enum):
    """What a row does: makes the device axis, reads it away, or carries a value through."""

    PRODUCER = "producer"
    CONSUMER = "consumer"
    CARRIER = "carrier"


@dataclass(frozen=True)
class Transfer:
    """One row of the table: its spellings (`patterns`, holes `{x}`...), the layout of its
    `source` hole it needs (`takes`), the layout it gives, and its program-level rewrite
    (`template`: holes of the pattern plus `{jax}`, `{jnp}`, `{sharding}`, `{owner}`, `{value}`
    the whole expression; None: no rewrite yet, a value it makes is of unknown layout to the
    step, PL301)."""

    name: str
    patterns: tuple[str, ...]
    takes: Layout
    gives: Layout
    role: Role
    template: str | None
    why: str
    source: str = "x"
    counts: tuple[str, ...] = ()  # holes that must be the number of local devices
    devices: tuple[str, ...] = ()  # holes that must be this process's devices
    pure: tuple[str, ...] = ()  # holes the rewrite drops: no call in them (`droppable`)
    lifts: bool = True  # False: its rewrite is not the same leaf by leaf (`jax.tree.map`)
    # True: it makes a Python number an array that is not weakly typed (NumPy stacks it as a
    # float64/int64 array), so `bfloat16` arithmetic with the replicas is float32 where the
    # number itself, passed as it is, stays weak (`_flow._check_python_float`, PL303)
    strong: bool = False


GLOBAL_BATCH = "{jax}.make_array_from_process_local_data({sharding}, {x})"
LOCAL_PART = "{hosts}.global_array_to_host_local_array({x}, {mesh}, {spec}({axis}))"
HOST_ARRAY = "{np}.asarray({x})"  # this process's part read into numpy
DONATED_COPY = "{jax}.tree.map({jnp}.copy, {x})"  # a replication of a donated argument
REPLICATED = "a replication deleted: the value is passed as it is, replicated (`P()`)"
# Every edit converting or deleting a batch split per device begins with SPLIT_EDIT
SPLIT_EDIT = "a split into per-device slices"
SPLIT = f"{SPLIT_EDIT} -> this process's part of a batch sharded on the mesh"
KEYS = (
    "per-device keys -> this process's part of the keys sharded on the mesh, one per device "
    "(the body takes its own key, `key[0]`, as under pmap)"
)
READ_BACK = "a readback of device 0 deleted: the value is the same on every device"
HOST_COPY = "the values copied to the host"
PRODUCER, CONSUMER, CARRIER = Role.PRODUCER, Role.CONSUMER, Role.CARRIER
HOST, REPLICAS, PER_DEVICE = Layout.HOST, Layout.REPLICAS, Layout.PER_DEVICE
KEYED, UNKNOWN = Layout.KEYS, Layout.UNKNOWN
N = ("n",)  # `{n}` is the number of local devices
LOCAL = ("devices",)  # `{devices}` is this process's devices, `jax.local_devices()`

BROADCASTS = tuple(
    f"{np}.broadcast_to({{x}}, {shape})"
    for np in ("jax.numpy", "numpy")
    for shape in ("({n},) + {x}.shape", "({n}, *{x}.shape)")
)
# `x.reshape((n, k) + x.shape[1:])` succeeds only for `k == x.shape[0] // n` (`-1`, or any
# spelling of it): it is the split into n blocks of rows whatever `k` says, so `{rows}` is any
# expression without a call (the rewrite drops it).
SPLITS = (
    *(
        f"{reshape}{shape}"
        for reshape in ("{x}.reshape(", "jax.numpy.reshape({x}, ", "numpy.reshape({x}, ")
        for shape in ("({n}, {rows}) + {x}.shape[1:])", "({n}, {rows}, *{x}.shape[1:]))")
    ),
    "{x}.reshape({n}, {rows}, *{x}.shape[1:])",  # the shape as arguments (an array's method)
)
# The removed `jax.device_put_replicated`/`device_put_sharded` as their rules (run before this
# one) rewrite them: `jax.device_put` of the stacked values, split over `devices` on the leading
# axis. Replicated: `len(devices)` copies of each leaf. Sharded: the shards stacked leaf by leaf;
# or, shards that are the rows of an array, the array itself.
LEADING_AXIS = (
    "jax.sharding.NamedSharding(jax.sharding.Mesh(numpy.array({devices}), ({axis},)), "
    "jax.sharding.PartitionSpec({axis}))"
)
STACKED_COPIES = "jax.tree.map(lambda {a}: jax.numpy.stack([{a}] * len({devices})), {x})"
STACKED_COPIES_PUT = f"jax.device_put({STACKED_COPIES}, {LEADING_AXIS})"
STACKED_SHARDS_PUT = (
    f"jax.device_put(jax.tree.map(lambda *{{xs}}: jax.numpy.stack({{xs}}), *{{x}}), {LEADING_AXIS})"
)
ROWS_PUT = f"jax.device_put({{x}}, {LEADING_AXIS})"
# The shards an array split into blocks of rows (`np.split(obs, n)`): that array, concatenated
# again. `{n}` is dropped: the original raises unless it is the number of devices.
ARRAY_SPLITS = ("numpy.split({x}, {n})", "jax.numpy.split({x}, {n})")
SPLIT_PUT = tuple(
    pattern.replace("{x}", split, 1)
    for split in ARRAY_SPLITS
    for pattern in ("jax.device_put_sharded({x}, {devices})", STACKED_SHARDS_PUT)
)
ROWS_CONCATENATED = (
    "{jax}.make_array_from_process_local_data({sharding}, {jax}.tree.map({jnp}.concatenate, {x}))"
)
KEYS_TEMPLATE = "{jax}.make_array_from_process_local_data({sharding}, {value})"
# Shards of any pytree, concatenated leaf by leaf (a list of arrays as well as of dicts).
CONCATENATED = (
    "{jax}.make_array_from_process_local_data("
    "{sharding}, {jax}.tree.map(lambda *xs: {jnp}.concatenate(xs), *{x}))"
)
# A pmapped `pmean` of its argument over its own axis, called (flax imagenet's module-level
# `cross_replica_mean`, AlgoPerf's `avg_fn`; the name is read through its one binding).
MEANS = tuple(
    f"jax.pmap(lambda {{v}}: jax.lax.pmean({{v}}, {inner}), {outer})({{x}})"
    for inner in ("{a}", "axis_name={a}")
    for outer in ("{a}", "axis_name={a}")
)
MEAN_OF_COPIES = (
    "a mean over devices of equal copies deleted: it is the value itself, replicated (`P()`)"
)
STACKED_FOREST = "{owner}.stack_forest({jax}.device_get({x}))"

# fmt: off
TRANSFERS: tuple[Transfer, ...] = (
    # Replications: one host value stacked as equal copies; deleted, the value is `P()`.
    Transfer("replicate", ("flax.jax_utils.replicate({x})",),  # NumPy-stacks a non-jax.Array
             HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, strong=True),
    Transfer("device_put_replicated",
             ("jax.device_put_replicated({x}, {devices})", STACKED_COPIES_PUT),
             HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, devices=LOCAL),
    Transfer("broadcast_to", BROADCASTS, HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, counts=N),
    Transfer("stack", ("jax.numpy.stack([{x}] * {n})",),  # keeps a Python number weak
             HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, counts=N),
    Transfer("stack", ("numpy.stack([{x}] * {n})",),
             HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, counts=N, strong=True),
    Transfer("tile", ("jax.numpy.tile({x}[None], ({n},) + (1,) * {x}.ndim)",),
             HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, counts=N),
    Transfer("repeat", ("jax.numpy.repeat({x}[None], {n}, axis=0)",),
             HOST, REPLICAS, PRODUCER, "{x}", REPLICATED, counts=N),
    # Splits: a flat host batch cut into per-device slices; this process's part of a batch.
    Transfer("shard", ("flax.training.common_utils.shard({x})",),
             HOST, PER_DEVICE, PRODUCER, GLOBAL_BATCH, SPLIT),
    Transfer("reshape", SPLITS, HOST, PER_DEVICE, PRODUCER, GLOBAL_BATCH, SPLIT, counts=N,
             pure=("rows",)),
    Transfer("device_put_split", SPLIT_PUT, HOST, PER_DEVICE, PRODUCER, GLOBAL_BATCH,
             SPLIT + " (the array split)", devices=LOCAL, pure=("n",), lifts=False),
    Transfer("device_put_sharded", ("jax.device_put_sharded({x}, {devices})", STACKED_SHARDS_PUT),
             HOST, PER_DEVICE, PRODUCER, CONCATENATED, SPLIT + " (the slices concatenated)",
             devices=LOCAL, lifts=False),
    Transfer("device_put_stacked", (ROWS_PUT,), HOST, PER_DEVICE, PRODUCER, ROWS_CONCATENATED,
             SPLIT + " (its rows concatenated)", devices=LOCAL, lifts=False),
    # Per-device keys: stacked in both forms, each device taking its own (`key[0]` in the body).
    Transfer("split", ("jax.random.split({x}, {n})", "jax.random.split({x}, num={n})"),
             HOST, KEYED, PRODUCER, KEYS_TEMPLATE, KEYS, counts=N),
    Transfer("shard_prng_key", ("flax.training.common_utils.shard_prng_key({x})",),
             HOST, KEYED, PRODUCER, KEYS_TEMPLATE, KEYS),
    # Readbacks: device 0's copy of equal copies; deleted, the value is read whole.
    Transfer("unreplicate", ("flax.jax_utils.unreplicate({x})",),
             REPLICAS, HOST, CONSUMER, "{x}", READ_BACK),
    Transfer("index", ("{x}[0]",), REPLICAS, HOST, CONSUMER, "{x}", READ_BACK),
    Transfer("get_metrics", ("flax.training.common_utils.get_metrics({x})",),
             REPLICAS, HOST, CONSUMER, STACKED_FOREST,
             "a readback of device 0 of each metric deleted: the results are replicated"),
    # Flattening: per-device results read as one flat host value; this process's part.
    Transfer("flatten", ("{x}.reshape(-1)",), PER_DEVICE, HOST, CONSUMER, LOCAL_PART,
             "a flattening over devices deleted: the result is flat already"),
    # Carriers: the same values in another container; the layout goes through.
    Transfer("device_get", ("jax.device_get({x})",), UNKNOWN, UNKNOWN, CARRIER, "{value}",
             HOST_COPY),
    Transfer("asarray", ("numpy.asarray({x})", "numpy.array({x})", "jax.numpy.asarray({x})"),
             UNKNOWN, UNKNOWN, CARRIER, "{value}", HOST_COPY),
    Transfer("astype", ("{x}.astype({x}.dtype)",), UNKNOWN, UNKNOWN, CARRIER, "{value}",
             "the same values, a weak type made strong"),
    # A mean over devices: of equal copies, the value itself; of per-device values (a batch
    # norm's statistics without `axis_name`) a real mean the program-level form has no value
    # for (it holds one value, not one per device): PL402 names the value.
    Transfer("cross_device_mean", MEANS, REPLICAS, REPLICAS, CARRIER, "{x}", MEAN_OF_COPIES),
    # No rewrite of their own: a prefetch is deleted where `_inputs.py` follows the iterator
    # it feeds (it then yields flat batches); elsewhere a value they make is an argument of
    # unknown layout to the step (PL301).
    Transfer("prefetch_to_device", ("flax.jax_utils.prefetch_to_device({x}, {size})",),
             PER_DEVICE, PER_DEVICE, CARRIER, None,
             "batches prefetched to the devices, still split per device"),
    Transfer("pad_shard_unpad", ("flax.jax_utils.pad_shard_unpad({x})",), HOST, HOST, CARRIER,
             None, "a step wrapped to pad, split and unpad its batches"),
)
# fmt: on


# The carriers kept as they are in both forms, each leaf's layout going through.
KEEPING = tuple(r for r in TRANSFERS if r.role is CARRIER and r.template == "{value}")


def rows(role: Role, gives: Layout) -> tuple[Transfer, ...]:
    """Return the rows of `role` giving `gives` that have a rewrite, in the table's order."""
    return tuple(
        r for r in TRANSFERS if r.role is role and r.gives is gives and r.template is not None
    )


def row_named(name: str) -> Transfer:
    """Return the first row called `name`."""
    return next(r for r in TRANSFERS if r.name == name)


def fill(template: str, holes: Mapping[str, cst.BaseExpression]) -> cst.BaseExpression:
    """Return `template` with its holes filled from `holes` (extra entries ignored)."""
    filled: dict[str, Any] = {k: v for k, v in holes.items() if k in _HOLE.findall(template)}
    return parse_template_expression(template, **filled)


def as_row(name: str, source: cst.BaseExpression | None, node: cst.BaseExpression) -> Match | None:
    """Return `node` read as row `name` of `source` (a form the table does not spell, such as
    a module helper's summary), None when `source` is None."""
    if source is None:
        return None
    row = row_named(name)
    return Match(row, {row.source: source, "value": node})


DEVICE_COUNTS = frozenset({"jax.local_device_count", "jax.device_count"})
TREE_MAPS = frozenset({"jax.tree.map", "jax.tree_util.tree_map", "jax.tree_map"})
# `lambda v: ...`: one plain parameter (maybe with a default), nothing else
ONE_PARAM = m.Lambda(
    m.Parameters(
        [m.Param()], star_arg=~m.Param(), kwonly_params=[], star_kwarg=None, posonly_params=[]
    )
)
_HOLE = re.compile(r"\{(\w+)\}")
_MARK = "__hole_"  # the name a pattern's hole is parsed as


@dataclass(frozen=True)
class Match:
    """A row matched at one expression: the row, and what each hole of its pattern holds."""

    row: Transfer
    holes: Mapping[str, cst.BaseExpression]
    lifted: bool = False  # matched leaf by leaf, through `jax.tree.map(lambda v: ..., x)`

    @property
    def source(self) -> cst.BaseExpression:
        """Return the value the row reads (its `source` hole)."""
        return self.holes[self.row.source]

    def rewrite(self, context: Mapping[str, cst.BaseExpression]) -> cst.BaseExpression:
        """Return the row's program-level form, its holes filled from the match and `context`
        (`jax`, `sharding`, ...: how the module spells them); the value itself for `{value}`."""
        assert self.row.template is not None
        return fill(self.row.template, {**context, **self.holes})


@functools.cache
def _pattern(text: str) -> cst.BaseExpression:
    """The pattern `text` parsed, its holes as marked names (each text parsed once)."""
    holes: dict[str, Any] = {name: cst.Name(_MARK + name) for name in _HOLE.findall(text)}
    return parse_template_expression(text, **holes)


def holes_of(text: str, node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    """The holes of the pattern `text` (its names as spelled) `node` is, else None."""
    holes: dict[str, cst.BaseExpression] = {}
    return holes if _unify(_pattern(text), node, holes, _as_spelled) else None


def match(
    node: cst.BaseExpression,
    qualname: Qualname,
    counts: Counts = lambda _: True,
    table: tuple[Transfer, ...] = TRANSFERS,
    loose: bool = False,
) -> Match | None:
    """Return the first row of `table` whose pattern `node` is (names resolved by meaning with
    `qualname`, holes `counts` names the number of local devices and `devices` this process's
    devices: whatever they hold when `loose`), else None."""
    for row in table:
        for pattern in map(_pattern, row.patterns):
            holes: dict[str, cst.BaseExpression] = {}
            if not _unify(pattern, node, holes, qualname):
                continue
            if any(not droppable(holes[h], qualname) for h in row.pure):
                continue
            if loose or not fewer(Match(row, holes), qualname, counts):
                return Match(row, holes | {"value": node})
    return None


def fewer(found: Match, qualname: Qualname, counts: Counts) -> cst.BaseExpression | None:
    """The hole of `found` that does not visibly name every device of this process (a count
    other than the number of local devices, devices other than `jax.local_devices()`: brax's
    `jax.random.split(key, local_devices_to_use)`, pmap then mapping over those devices alone),
    else None."""
    wrong = [found.holes[h] for h in found.row.counts if not counts(found.holes[h])]
    devices = [found.holes[h] for h in found.row.devices]
    wrong += [d for d in devices if _called(d, qualname) != "jax.local_devices"]
    return wrong[0] if wrong else None


def lifted(
    node: cst.BaseExpression,
    qualname: Qualname,
    counts: Counts = lambda _: True,
    table: tuple[Transfer, ...] = TRANSFERS,
    named: Callable[[str], cst.Lambda | None] = lambda _: None,
    loose: bool = False,
) -> Match | None:
    """Return the row `jax.tree.map(lambda v: <row of v>, x)` applies to every leaf of `x`
    (its source hole then holds `x`), else None. `named`: the lambda a name is bound to;
    `loose`: as `match`'s."""
    mapped = tree_mapped(node, qualname, named)
    if mapped is None:
        return None
    param, body, tree = mapped
    leaf = match(body, qualname, counts, tuple(r for r in table if r.lifts), loose)
    inner = leaf
    while inner is not None and inner.row in KEEPING and not isinstance(inner.source, cst.Name):
        inner = match(inner.source, qualname, counts, KEEPING, loose)  # a carrier of a carrier
    if inner is None or not isinstance(inner.source, cst.Name) or inner.source.value != param:
        return None
    assert leaf is not None  # its source hole is the leaf (or a carrier of it): `tree` below
    if any(
        param in names_in(v)
        for k, v in leaf.holes.items()
        if k not in (leaf.row.source, "value", *leaf.row.pure)  # a dropped hole may read it
    ):
        return None  # a hole besides the leaf reads the leaf: not the same row for every leaf
    return Match(leaf.row, {**leaf.holes, leaf.row.source: tree, "value": node}, lifted=True)


def tree_mapped(
    node: cst.BaseExpression,
    qualname: Qualname,
    named: Callable[[str], cst.Lambda | None] = lambda _: None,
) -> tuple[str, cst.BaseExpression, cst.BaseExpression] | None:
    """`jax.tree.map(lambda v: body, x)`, the lambda maybe a name `named` binds: (v, body, x);
    else None."""
    if not isinstance(node, cst.Call) or qualname(node.func) not in TREE_MAPS:
        return None
    if len(node.args) != 2 or any(a.keyword is not None or a.star for a in node.args):
        return None
    fun, tree = node.args[0].value, node.args[1].value
    if isinstance(fun, cst.Name):  # `replicate_array = lambda x: ...` in the function
        fun = named(fun.value) or fun
    if not m.matches(fun, ONE_PARAM):
        return None
    assert isinstance(fun, cst.Lambda)
    return fun.params.params[0].name.value, fun.body, tree


def droppable(node: cst.BaseExpression, qualname: Qualname) -> bool:
    """Nothing happens when `node` is not evaluated: it holds no call, or it is a device count
    (`jax.local_device_count()`)."""
    return counts_devices(node, qualname) or not _has_call(node)


def counts_devices(node: cst.BaseExpression, qualname: Qualname) -> bool:
    """`jax.local_device_count()` or `jax.device_count()`: the number of devices."""
    return _called(node, qualname) in DEVICE_COUNTS


def _called(node: cst.BaseExpression, qualname: Qualname) -> str | None:
    """The function `node` calls with no argument (`jax.local_devices()`), else None."""
    return qualname(node.func) if isinstance(node, cst.Call) and not node.args else None


def _has_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) or any(_has_call(c) for c in node.children)


def _unify(pattern: cst.CSTNode, node: cst.CSTNode, holes: Holes, qualname: Qualname) -> bool:
    """Return True if `node` is `pattern` up to whitespace and parentheses, binding `holes`
    (a hole seen twice must hold the same code); a dotted name of the pattern in a call's
    function position matches any spelling of that qualified name."""
    if isinstance(pattern, cst.Name) and pattern.value.startswith(_MARK):
        hole = pattern.value[len(_MARK) :]
        if not isinstance(node, cst.BaseExpression):
            return False
        if hole in holes:
            return _unify_fields(holes[hole], node, {}, _as_spelled)  # the same code
        holes[hole] = node
        return True
    if isinstance(pattern, cst.Call) and isinstance(node, cst.Call) and qualname is not _as_spelled:
        name = dotted(pattern.func)
        if name is not None and "." in name and not name.startswith(_MARK):
            if qualname(node.func) != name:
                return False
            if isinstance(node.func, cst.Attribute):  # `common_utils.get_metrics`: the owner
                holes.setdefault("owner", node.func.value)
            return _unify_fields(pattern, node, holes, qualname, skip=("func",))
    return _unify_fields(pattern, node, holes, qualname)


def _unify_fields(
    pattern: cst.CSTNode,
    node: cst.CSTNode,
    holes: Holes,
    qualname: Qualname,
    skip: tuple[str, ...] = (),
) -> bool:
    if type(pattern) is not type(node):
        return False
    operator = getattr(pattern, "operator", None)
    if operator is not None and type(operator) is not type(getattr(node, "operator", None)):
        return False
    for name in child_fields(type(pattern)):
        if name in skip:
            continue
        want, have = getattr(pattern, name), getattr(node, name)
        if isinstance(want, cst.CSTNode) and isinstance(have, cst.CSTNode):
            want, have = [want], [have]  # one child: unified as a sequence of one
        if isinstance(want, (list, tuple)) and isinstance(have, (list, tuple)):
            pairs = zip(want, have)
            if len(want) != len(have) or not all(_unify(w, h, holes, qualname) for w, h in pairs):
                return False
        elif want != have:  # a child against none, or two values that differ (`Name.value`)
            return False
    return True


def _as_spelled(node: cst.BaseExpression) -> str | None:
    """Names compared as spelled: two holes hold the same value when written alike."""
    return None
