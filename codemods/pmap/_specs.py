"""Translating `jax.pmap`/`jax.vmap`-style axes into `jax.shard_map` partition specs, as CST.

`in_axes`/`out_axes` say where each value's mapped axis is with a pytree prefix of ints and
`None`s; `in_specs`/`out_specs` say the same with `PartitionSpec`s: axis `k` along the mesh axis
`name` is `P(None, ..., None, name)` with `k` leading `None`s, and an unmapped value is `P()`.
`spec_tree` keeps the prefix's structure (tuples stay tuples, dicts stay dicts) and the source's
layout and comments, and refuses what cannot be known without running the code: computed axes,
negative axes (they need the value's rank), booleans and unpacking.

The options of one pmap are read here too, for both forms: `statics` reads
`static_broadcasted_argnums` (a literal, or a static tail), `unbound` is the def as `partial`'s
keywords leave it, and `read_options` gives the program-level form everything it takes
(`Options`: the def mapped, the axis and its literal name, `in_axes`, the static and donated
arguments), or NotVisible naming the option it does not take.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_expression

from jaxmigrate.toolkit.emit import code, joined

from ._declines import Decline, NotVisible
from ._layout import Qualname, holes_of
from ._readat import short as _short

SpecMaker = Callable[[int | None], cst.BaseExpression]


class Untranslatable(ValueError):
    """An axes expression that cannot be translated statically; the message says why."""


def literal_axis(node: cst.BaseExpression) -> int | None:
    """Return the axis `node` spells (`1`, `None`); raise Untranslatable for anything else."""
    if isinstance(node, cst.Name) and node.value == "None":
        return None
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        raise Untranslatable(f"`{node.value}` is not an axis: pmap and vmap reject booleans")
    if m.matches(node, m.UnaryOperation(m.Minus(), m.Integer())):
        raise Untranslatable("a negative axis needs the value's rank, which is not known here")
    raise Untranslatable(f"`{code(node)}` is computed: its axes are only known at run time")


def spec_tree(axes: cst.BaseExpression, make_spec: SpecMaker) -> cst.BaseExpression:
    """Return `axes` with each leaf axis replaced by `make_spec(axis)`, keeping its containers."""
    if isinstance(axes, (cst.Tuple, cst.List, cst.Dict)):
        return axes.with_changes(elements=[_element(e, make_spec) for e in axes.elements])
    return make_spec(literal_axis(axes))


Entry = cst.BaseElement | cst.BaseDictElement


def _element(element: Entry, make_spec: SpecMaker) -> Entry:
    """An entry of a tuple, list or dict of axes, its axes made specs (`*x`, `**x`: raise)."""
    if not isinstance(element, (cst.Element, cst.DictElement)):
        stars = "**" if isinstance(element, cst.BaseDictElement) else "*"
        raise Untranslatable(f"unpacking (`{stars}`) inside the axes: their structure is not known")
    return element.with_changes(value=spec_tree(element.value, make_spec))


def partition_spec(
    spec: cst.BaseExpression, names: Sequence[cst.BaseExpression], axis: int | None
) -> cst.Call:
    """Return `P()` for an unmapped value, else `P(None, ..., *names)` with `axis` Nones."""
    if axis is None:
        return cst.Call(func=spec.deep_clone())
    entries = [cst.Name("None")] * axis + [n.deep_clone() for n in names]
    return cst.Call(func=spec.deep_clone(), args=joined([cst.Arg(e) for e in entries]))


def argnums(node: cst.BaseExpression) -> tuple[int, ...]:
    """Return the positions a literal `static_argnums`-like value names; else Untranslatable."""
    if isinstance(node, cst.Integer):
        return (int(node.evaluated_value),)
    if isinstance(node, (cst.Tuple, cst.List)):
        values = [e.value for e in node.elements if isinstance(e, cst.Element)]
        found = [int(v.evaluated_value) for v in values if isinstance(v, cst.Integer)]
        if len(found) == len(node.elements):  # every element a literal number
            return tuple(found)
    raise Untranslatable(f"`{code(node)}` is computed: which arguments are static is not known")


def statics(
    node: cst.BaseExpression, tail: bool = True
) -> tuple[tuple[int, ...], tuple[int, cst.BaseExpression] | None]:
    """Return the positions a literal `static_broadcasted_argnums` names (`argnums`), or, as
    second, its static tail `(k, n)` (`static_tail`; not looked for unless `tail`); raise
    Untranslatable for any other value."""
    if tail and (found := static_tail(node)) is not None:
        return (), found
    return argnums(node), None


def static_tail(node: cst.BaseExpression) -> tuple[int, cst.BaseExpression] | None:
    """Return `(k, n)` for `tuple(range(k, k + n))` (or `list(...)`, or `range(...)` alone),
    the static positions a def `f(a, ..., *args)` of `k` parameters gives its star arguments
    (big_vision's flexi trainers); None for any other value. `n` is a name, an attribute or
    `len()` of one: it is evaluated again where the specs are built."""
    node = (holes_of("tuple({r})", node) or holes_of("list({r})", node) or {"r": node})["r"]
    holes = holes_of("range({k}, {k} + {n})", node)
    if holes is None or not isinstance(start := holes["k"], cst.Integer):
        return None
    count = holes["n"]
    named = (holes_of("len({x})", count) or {"x": count})["x"]
    plain = isinstance(named, (cst.Name, cst.Attribute))
    return (int(start.evaluated_value), count) if plain else None


TAIL_BUILTINS = ("tuple", "list", "range", "len")  # a static tail is read with these: none rebound


def tail_fits(params: cst.Parameters, start: int) -> bool:
    """`def f(a, ..., *args)`: `start` parameters without defaults, then `*args`, the shape a
    static tail (`static_tail`) is for."""
    return (
        isinstance(params.star_arg, cst.Param)
        and len((*params.posonly_params, *params.params)) == start
        and not any(p.default is not None for p in params.params)
    )


def with_static_tail(
    specs: cst.BaseExpression, start: int, count: cst.BaseExpression
) -> cst.BaseExpression:
    """Return the specs of a def with `start` parameters and `*args`, each star argument
    static: `(spec, ...) + (None,) * count`, one spec for all spread over the `start` places."""
    if isinstance(specs, cst.Tuple):
        if len(specs.elements) != start:
            raise Untranslatable(
                f"`in_axes` has {len(specs.elements)} entries for {start} named parameters (one "
                "each is translated, none for the star arguments)"
            )
        head: cst.BaseExpression = specs
    else:
        head = tuple_of([specs.deep_clone() for _ in range(start)])
    return parse_template_expression(
        "{head} + (None,) * {count}", head=head, count=count.deep_clone()
    )


def with_statics(
    specs: cst.BaseExpression, statics: Sequence[int], arity: int | None
) -> cst.BaseExpression:
    """Return `specs` with `None` (static: passed through, not sharded) at `statics` positions.

    A tuple of per-argument specs gets them in place (or appended right after its end); one spec
    for every argument is spread over `arity` positions, which must then be known.
    """
    if isinstance(specs, cst.Tuple):
        elements = list(specs.elements)
        for i in sorted(statics):
            if i > len(elements):
                raise Untranslatable(f"static argument {i} is past the end of `in_axes`")
            if i < len(elements):
                elements[i] = elements[i].with_changes(value=cst.Name("None"))
            else:
                elements = [*_with_comma(elements), cst.Element(cst.Name("None"))]
        return specs.with_changes(elements=elements)
    if arity is None:
        raise Untranslatable(
            "static arguments with one `in_axes` for all: the function's arity is not known"
        )
    if any(i >= arity for i in statics):
        raise Untranslatable("a static argument number is past the function's parameters")
    values = [cst.Name("None") if i in statics else specs.deep_clone() for i in range(arity)]
    return tuple_of(values)


def tuple_of(values: Sequence[cst.BaseExpression]) -> cst.Tuple:
    """Return the tuple `(a, b)` of `values` (libcst writes the comma a 1-tuple needs)."""
    return cst.Tuple([cst.Element(v) for v in values])


def _with_comma(elements: Sequence[cst.BaseElement]) -> list[cst.BaseElement]:
    """Return `elements`, each followed by a comma and a space."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [e if m.matches(e.comma, SPACED) else e.with_changes(comma=comma) for e in elements]


SPACED = m.Comma(whitespace_after=~m.SimpleWhitespace(""))  # then a space or a line break


# Reading one pmap's options --------------------------------------------------------------------
class NotMigrated(Exception):
    """A pmap site this pass leaves alone; the message is the reason."""


KEYWORDS = frozenset(
    {"in_axes", "out_axes", "static_broadcasted_argnums", "donate_argnums"}
    | {"devices", "backend", "axis_size"}
)
TAKEN = frozenset({"devices", "donate_argnums", "in_axes", "static_broadcasted_argnums"})
NOT_LITERAL = "`static_broadcasted_argnums` is not a literal"
PARTIAL = "functools.partial"


@dataclass(frozen=True)
class Pmapped:
    """Which argument of one `jax.pmap(...)` (or `partial(jax.pmap, ...)`) is which: indices."""

    fun: int | None
    axis_name: int | None
    options: dict[str, int]


def read_pmap(args: Sequence[cst.Arg], *, has_fun: bool) -> Pmapped:
    """Return which of `args` is which pmap parameter; raise NotMigrated if not understood."""
    positional = ("fun", "axis_name") if has_fun else ()
    found: dict[str, int] = {}
    for i, arg in enumerate(args):
        if arg.star:
            raise NotMigrated(f"`{arg.star}` unpacking: which parameters it fills is not known")
        if arg.keyword is None and i >= len(positional):
            raise NotMigrated("more positional arguments than `jax.pmap` takes")
        name = positional[i] if arg.keyword is None else arg.keyword.value
        if name == "fun" and arg.keyword is not None:
            raise NotMigrated("`fun=` passed by keyword")
        if name not in {*positional, "axis_name", *KEYWORDS} or name in found:
            raise NotMigrated(f"unexpected argument `{name}`: the call fails today")
        found[name] = i
    if has_fun and "fun" not in found:
        raise NotMigrated("no function to map")
    return Pmapped(found.pop("fun", None), found.pop("axis_name", None), found)


@dataclass
class Options:
    """What one pmap says: the function mapped, its axis and the options this form takes."""

    fun: cst.BaseExpression  # the def's name, or `functools.partial(name, k=...)`
    axis: cst.BaseExpression
    donate: cst.Arg | None = None
    in_axes: cst.BaseExpression | None = None
    statics: tuple[int, ...] = ()
    statics_arg: cst.Arg | None = None
    # `tuple(range(k, k + n))` for a def `f(a, ..., *args)` of `k` parameters: every star
    # argument static (big_vision's flexi trainers), `(k, n)`
    tail: tuple[int, cst.BaseExpression] | None = None
    bound: tuple[str, ...] = ()  # the parameters `functools.partial` binds by keyword
    name: str = ""  # the name of the def mapped
    named: bool = True  # False: pmap's axis is unnamed (the body cannot name it), `axis` ours
    literal: str = ""  # the axis's name: `axis`'s value, or the string the constant `axis` is
    spellings: frozenset[str] = frozenset()  # the module's constants the body may name it by


def options_of(
    pmap: cst.Call,
    qualname: Qualname,
    unnamed: cst.BaseExpression | None = None,
    constants: Mapping[str, str] | None = None,
) -> Options:
    """Read `jax.pmap(fun, axis_name, ...)`; raise NotVisible when this form does not take it."""
    if not pmap.args or pmap.args[0].keyword is not None:
        why = "the pmapped function is not a def of this module named directly"
        raise NotVisible(why, Decline.NOT_A_DEF)
    return read_options(pmap.args, qualname, unnamed=unnamed, constants=constants)


def read_options(
    args: Sequence[cst.Arg],
    qualname: Qualname,
    *,
    fun: cst.BaseExpression | None = None,
    unnamed: cst.BaseExpression | None = None,
    constants: Mapping[str, str] | None = None,
) -> Options:
    """Read pmap's `args`: a call's, or, given `fun` (the def a decorator maps), the options of
    `partial(jax.pmap, ...)`; `unnamed` names an axis pmap leaves unnamed. `constants`: the
    module's names bound once, at module level, to a string (brax's `_PMAP_AXIS_NAME = "i"`):
    such a name is the axis's literal name, kept as written."""
    constants = {} if constants is None else constants
    try:
        pmapped = read_pmap(args, has_fun=fun is None)
    except NotMigrated as error:
        raise NotVisible(str(error), Decline.OPTION) from None
    found = {keyword: args[i] for keyword, i in pmapped.options.items()}
    for keyword, arg in found.items():
        if keyword == "devices" and not all_devices(arg.value, qualname):
            # lm1b/wmt's `per_host_sum_pmap`: one device per process (`jax.devices()`, every
            # device of the job in order, is pmap's default, the mesh's)
            why = f"pmap's `devices={_short(arg.value)}` is not every device of the job"
            raise NotVisible(why, Decline.OPTION)
        if keyword not in TAKEN:
            raise NotVisible(f"pmap's `{keyword}` is not taken by this form yet", Decline.OPTION)
    fun = args[pmapped.fun].value if pmapped.fun is not None else fun
    assert fun is not None
    try:
        name, bound = mapped_name(fun, qualname)
    except NotVisible:
        if pmapped.axis_name is not None:  # (`mapped_name` takes any lambda)
            raise
        # no def: read as opaque, the axis unnamed (the survey's `_opaque_body`)
        name, bound = "", ()
    axis = args[pmapped.axis_name].value if pmapped.axis_name is not None else unnamed
    if isinstance(axis, (cst.Name, cst.Attribute)) and code(axis) in constants:
        literal = constants[code(axis)]  # `_AXIS`, or a field `self._axis_name` set once
    elif isinstance(axis, cst.SimpleString) and isinstance(axis.evaluated_value, str):
        literal = axis.evaluated_value
    else:
        named = f" (`{_short(axis)}`)" if axis is not None else ""
        raise NotVisible(f"the mapped axis has no literal name{named}", Decline.UNNAMED_AXIS)
    options = Options(fun, axis, found.get("donate_argnums"), bound=bound, name=name)
    options.literal = literal
    options.spellings = frozenset(n for n, v in constants.items() if v == literal)
    options.named = pmapped.axis_name is not None
    options.in_axes = found["in_axes"].value if "in_axes" in found else None
    if "static_broadcasted_argnums" in found:
        options.statics_arg = found["static_broadcasted_argnums"]
        try:  # as the faithful form reads it
            options.statics, options.tail = statics(options.statics_arg.value)
        except Untranslatable:
            raise NotVisible(NOT_LITERAL, Decline.OPTION) from None
    return options


def all_devices(node: cst.BaseExpression, qualname: Qualname) -> bool:
    """`jax.devices()`: the devices pmap maps over by default (`jax.local_devices()` is not: on a
    multi-process job its collectives would span this process's devices only)."""
    return isinstance(node, cst.Call) and not node.args and qualname(node.func) == "jax.devices"


def mapped_name(fun: cst.BaseExpression, qualname: Qualname) -> tuple[str, tuple[str, ...]]:
    """Return the name of the def `fun` maps and the parameters it binds by `partial` keywords
    (no name for a lambda)."""
    if isinstance(fun, cst.Name):
        return fun.value, ()
    if isinstance(fun, cst.Lambda):
        return "", ()
    if (found := partial_keywords(fun, qualname)) and isinstance(found[0], cst.Name):
        return found[0].value, tuple(a.keyword.value for a in found[1] if a.keyword)
    why = "the pmapped function is not a def of this module named directly (or with `partial`)"
    raise NotVisible(why, Decline.NOT_A_DEF)


BOUND = m.Call(args=[m.Arg(keyword=None, star=""), m.ZeroOrMore(m.Arg(keyword=m.Name(), star=""))])


def partial_keywords(
    node: cst.BaseExpression | None, qualname: Qualname
) -> tuple[cst.BaseExpression, Sequence[cst.Arg]] | None:
    """`functools.partial(f, k=v, ...)`, only keywords after `f`: `f` and those; else None."""
    if not isinstance(node, cst.Call) or qualname(node.func) != PARTIAL:
        return None
    return (node.args[0].value, node.args[1:]) if m.matches(node, BOUND) else None


def unbound(body: cst.FunctionDef, bound: tuple[str, ...]) -> cst.FunctionDef:
    """Return `body` as the step sees it: without the parameters `partial` binds by keyword.

    They are the same on every device (pmap does not map them): replicated values in the body.
    """
    if not bound:
        return body
    params = body.params
    order = [*params.params, *params.kwonly_params]
    if missing := [b for b in bound if b not in {p.name.value for p in order}]:
        why = f"`partial` binds `{missing[0]}`, not a parameter of the def"
        raise NotVisible(why, Decline.SIGNATURE)
    first = next(i for i, p in enumerate(order) if p.name.value in bound)
    kept = list(params.params[:first])
    later = [p for p in order[first:] if p.name.value not in bound]
    # The later ones keep their defaults, or are passed by keyword (a position would fill the
    # first parameter bound): keyword-only to the step.
    kwonly = [p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in later]
    star = cst.ParamStar() if kwonly else cst.MaybeSentinel.DEFAULT
    changed = params.with_changes(params=kept, kwonly_params=kwonly, star_arg=star)
    return body.with_changes(params=changed)
