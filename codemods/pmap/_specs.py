"""Translating `jax.pmap`/`jax.vmap`-style axes into `jax.shard_map` partition specs, as CST.

`in_axes`/`out_axes` say where each value's mapped axis is with a pytree prefix of ints and
`None`s; `in_specs`/`out_specs` say the same with `PartitionSpec`s: axis `k` along the mesh axis
`name` is `P(None, ..., None, name)` with `k` leading `None`s, and an unmapped value is `P()`.
`spec_tree` keeps the prefix's structure (tuples stay tuples, dicts stay dicts) and the source's
layout and comments, and refuses what cannot be known without running the code: computed axes,
negative axes (they need the value's rank), booleans and unpacking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_expression

from jaxmigrate.toolkit.emit import code, joined

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


def static_tail(node: cst.BaseExpression) -> tuple[int, cst.BaseExpression] | None:
    """Return `(k, n)` for `tuple(range(k, k + n))` (or `list(...)`, or `range(...)` alone),
    the static positions a def `f(a, ..., *args)` of `k` parameters gives its star arguments
    (big_vision's flexi trainers); None for any other value. `n` is a name, an attribute or
    `len()` of one: it is evaluated again where the specs are built."""
    if isinstance(node, cst.Call) and _called(node, "tuple", "list") and len(node.args) == 1:
        node = node.args[0].value
    if not (isinstance(node, cst.Call) and _called(node, "range") and len(node.args) == 2):
        return None
    start, stop = (a.value for a in node.args)
    if not isinstance(start, cst.Integer) or any(a.keyword or a.star for a in node.args):
        return None
    if not (isinstance(stop, cst.BinaryOperation) and isinstance(stop.operator, cst.Add)):
        return None
    head, count = stop.left, stop.right
    if not isinstance(head, cst.Integer) or head.evaluated_value != start.evaluated_value:
        return None
    named: cst.BaseExpression | None = count
    if isinstance(count, cst.Call) and _called(count, "len") and len(count.args) == 1:
        named = None if count.args[0].star else count.args[0].value
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


def _called(call: cst.Call, *names: str) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value in names


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
    """Return the tuple `(a, b)` of `values`, with the trailing comma a 1-tuple needs."""
    elements: list[cst.BaseElement] = [cst.Element(v) for v in values]
    if len(elements) == 1:
        return cst.Tuple([elements[0].with_changes(comma=cst.Comma())])
    return cst.Tuple([*_with_comma(elements[:-1]), *elements[-1:]])


def _with_comma(elements: Sequence[cst.BaseElement]) -> list[cst.BaseElement]:
    """Return `elements`, each followed by a comma and a space."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [e if m.matches(e.comma, SPACED) else e.with_changes(comma=comma) for e in elements]


SPACED = m.Comma(whitespace_after=~m.SimpleWhitespace(""))  # then a space or a line break
