"""Calls made through a shortcut for `jax.pmap`, read as the `jax.pmap(...)` call they make.

ferminet binds `pmap = functools.partial(jax.pmap, axis_name=PMAP_AXIS_NAME)` in its
`constants` module and maps its functions with `constants.pmap(step, donate_argnums=1)` and
`@functools.partial(constants.pmap, donate_argnums=(0, 1))` (vmcnet's `distribute.pmap`, and
the code bases that copied ferminet's `constants.py`, bind the same shortcut). No `jax.pmap` is written at those calls, so the rule found none of them. A call made
through the shortcut is `jax.pmap` called with the shortcut's keywords, then its own (a keyword
of its own wins, as `functools.partial` lets it): `written_out` writes it so, and the rule reads
and rewrites that call like any other. Where the rule leaves such a call as it is, `restored`
puts the shortcut back: what the module says is changed only where a site is rewritten.

A shortcut is a name bound once at the level of the module itself or of a module of the code
base it imports (`FileState.modules`), to `functools.partial(jax.pmap, k=v, ...)`: keywords only,
each value a literal (`"i"`, `(0, 1)`) or a name bound once at that module's level to one (then
spelled as the calling module reaches it: `constants.PMAP_AXIS_NAME`). A call through a shortcut
imported by its own name (`from ferminet.constants import pmap`) is written out only when the
shortcut's keywords are literals: their names are not bound in the calling module. Timid, and
left as written: the shortcut passed as a value, a call with a second positional argument (it
fails today: `axis_name` given twice), a call through another call through a shortcut (the
outer one is read). A call a module cannot write out (it does not bind `jax`, which the call
would name, or the shortcut's keyword names a constant it does not import) is skipped, and
says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from jaxmigrate.toolkit.emit import code
from jaxmigrate.toolkit.scope import BindingKind, ScopeModel

from ._forms import base_of
from ._imported import Imported
from ._reach import nodes_in, replaced
from ._specs import partial_keywords

PMAP = "jax.pmap"
NO_JAX = (
    "`{}`, a shortcut for `jax.pmap`, is not read here: this module does not import `jax`, "
    "which the call it makes names (`import jax` would let it be migrated)"
)
UNREACHED = (
    "`{}`, a shortcut for `jax.pmap`, is not read here: its keywords name {} of `{}`, which "
    "this module does not import"
)
PARTIAL = "functools.partial"
BINDING = re.compile(r"^\w+\s*=\s*[\w.]*partial\(\s*[\w.]*pmap\b", re.MULTILINE)


@dataclass(frozen=True)
class Shortcut:
    """A shortcut for `jax.pmap`: its keywords, each as `value`s spelled in its own module, and
    the module-level names it reads (those must be reached through the module)."""

    keywords: tuple[tuple[str, cst.BaseExpression], ...]
    names: frozenset[str]


def shortcuts_in(names: ScopeModel) -> dict[str, Shortcut]:
    """The shortcuts for `jax.pmap` a module binds at its level, by name."""
    found: dict[str, Shortcut] = {}
    constants = _literal_names(names)
    for name, bindings in names.module_scope.bindings.items():
        value = bindings[0].value if len(bindings) == 1 and bindings[0].plain else None
        bound = partial_keywords(value, names.qualified_name)
        if bound is None or names.qualified_name(bound[0]) != PMAP:
            continue
        keywords = tuple((a.keyword.value, a.value) for a in bound[1] if a.keyword is not None)
        read = {n.value for _, v in keywords for n in nodes_in(v, cst.Name)} - {"True", "False"}
        if all(_literal(v, constants) for _, v in keywords):
            found[name] = Shortcut(keywords, frozenset(read - {"None"}))
    return found


def _literal_names(names: ScopeModel) -> frozenset[str]:
    """The names a module binds once, at its level, to a literal (no function rebinds them)."""
    return frozenset(
        name
        for name, bindings in names.module_scope.bindings.items()
        if len(bindings) == 1 and bindings[0].plain and not names.bound_below_module(name)
        if _literal(bindings[0].value, frozenset())
    )


def _literal(node: cst.CSTNode | None, constants: frozenset[str]) -> bool:
    """A literal (a tuple or list of them too), or a name of `constants`."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(_literal(e.value, constants) for e in node.elements)
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None") or node.value in constants
    return isinstance(node, (cst.SimpleString, cst.Integer, cst.Float))


Reached = tuple[Shortcut, str | None] | str  # `_reachable`'s answer for one spelling


@dataclass
class WrittenOut:
    """A module with its calls through shortcuts written out, and each call written with the
    call it was (`restored` puts back those the rule leaves as they are)."""

    module: cst.Module
    written: list[tuple[cst.BaseExpression, cst.BaseExpression]]
    unread: list[tuple[cst.CSTNode, str]]  # calls through a shortcut left unread, and why


def written_out(module: cst.Module, names: ScopeModel, imported: Imported) -> WrittenOut | None:
    """`module` with each call through a shortcut for `jax.pmap` written as the `jax.pmap(...)`
    call it makes; None when it makes none."""
    reachable = _reachable(names, imported)
    if not reachable:
        return None
    jax = names.module_alias("jax")
    partial = names.module_binding(PARTIAL)
    functools = names.module_alias("functools")
    partial = partial or (f"{functools}.partial" if functools is not None else None)

    def pmap() -> cst.Attribute:  # a node of its own at each call (ids key the analysis)
        return cst.Attribute(cst.Name(jax or "jax"), cst.Name("pmap"))

    written: dict[int, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
    scope = names.module_scope
    unread: list[tuple[cst.CSTNode, str]] = []

    def keywords_of(node: cst.BaseExpression) -> list[cst.Arg] | str | None:
        """The keywords of the shortcut `node` names, spelled here; None if it names none; why
        not, if they cannot be spelled here (`NO_JAX`, `UNREACHED`)."""
        spelled = code(node) if isinstance(node, (cst.Name, cst.Attribute)) else ""
        root = base_of(node) if spelled in reachable else None  # `constants` of `constants.pmap`
        if not isinstance(root, cst.Name) or names.scope_of(root).lookup(root.value) is not scope:
            return None  # not the module's own binding where `node` is
        if jax is None:
            return NO_JAX.format(spelled)
        if isinstance(found := reachable[spelled], str):
            return found
        shortcut, reach = found
        return [
            cst.Arg(_respelled(value.deep_clone(), shortcut.names, reach), keyword=cst.Name(key))
            for key, value in shortcut.keywords
        ]

    decorators = {id(d.decorator): d for d in nodes_in(module, cst.Decorator)}
    for call in nodes_in(module, cst.Call):
        args = list(call.args)
        is_partial = bool(args) and names.qualified_name(call.func) == PARTIAL
        keywords = keywords_of(args[0].value if is_partial else call.func) if args else None
        if keywords is None or args[0].keyword is not None or any(a.star for a in args):
            continue
        if isinstance(keywords, str):
            unread.append((decorators.get(id(call), call), keywords))  # said at the `@`
            continue
        if not is_partial and sum(a.keyword is None for a in args) > 1:
            continue  # `pmap(f, "i")`: `axis_name` given twice, the call fails today
        given = {a.keyword.value for a in args if a.keyword is not None}
        keywords = [k for k in keywords if k.keyword is not None and k.keyword.value not in given]
        first = args[0].with_changes(value=pmap()) if is_partial else args[0]
        new = call.with_changes(
            func=call.func if is_partial else pmap(), args=_inserted(first, keywords, args[1:])
        )
        written[id(call)] = (new, call)
    for decorator in decorators.values():  # `@constants.pmap`
        keywords = keywords_of(decorator.decorator)
        if isinstance(keywords, str):
            unread.append((decorator, keywords))
        elif keywords is not None and partial is not None:
            partial_call = cst.Call(cst.parse_expression(partial), [cst.Arg(pmap()), *keywords])
            written[id(decorator.decorator)] = (partial_call, decorator.decorator)
    if not written and not unread:
        return None
    out = replaced(module, {k: new for k, (new, _) in written.items()}) if written else module
    return WrittenOut(out, list(written.values()), unread)


def restored(module: cst.Module, written: WrittenOut) -> cst.Module:
    """`module`, the rule's output, with every call `written_out` wrote that the rule left as
    it was put back as it was written."""

    class Restore(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
            found = (old for new, old in written.written if updated_node.deep_equals(new))
            return next(found, updated_node)

    return module.visit(Restore())


def _inserted(first: cst.Arg, keywords: list[cst.Arg], rest: list[cst.Arg]) -> list[cst.Arg]:
    """`first`, then `keywords`, then `rest`, on the lines they were on."""
    spaced = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if not keywords:
        return [first, *rest]
    keywords = [k.with_changes(comma=spaced) for k in keywords]
    if not rest:  # the last argument keeps the first one's (a trailing comma, a line break)
        keywords[-1] = keywords[-1].with_changes(comma=first.comma)
        first = first.with_changes(comma=spaced)
    elif first.comma is cst.MaybeSentinel.DEFAULT:
        first = first.with_changes(comma=spaced)
    return [first, *keywords, *rest]


def _reachable(names: ScopeModel, imported: Imported) -> dict[str, Reached]:
    """The shortcuts the module can call, by spelling (`pmap`, `constants.pmap`), each with the
    module name its names are reached through (None: they are the module's own, or literals);
    or why a shortcut imported by its own name cannot be written out here."""
    found: dict[str, Reached] = {k: (v, None) for k, v in shortcuts_in(names).items()}
    for local, bindings in names.module_scope.bindings.items():
        qualname = bindings[0].qualname if len(bindings) == 1 else None
        if bindings[0].kind is not BindingKind.IMPORT or qualname is None:
            continue
        modules = (qualname, qualname.rpartition(".")[0])
        if not any(may_bind(imported.texts.get(m, "")) for m in modules):
            continue  # parsed only if its text may bind a shortcut
        if (other := imported.scope(qualname)) is not None:  # `from ferminet import constants`
            found |= {f"{local}.{k}": (v, local) for k, v in shortcuts_in(other).items()}
            continue
        module, _, name = qualname.rpartition(".")  # `from ferminet.constants import pmap`
        other = imported.scope(module)
        shortcut = shortcuts_in(other).get(name) if other is not None else None
        if shortcut is not None and not shortcut.names:
            found[local] = (shortcut, None)
        elif shortcut is not None:
            read = ", ".join(f"`{n}`" for n in sorted(shortcut.names))
            found[local] = UNREACHED.format(local, read, module)
    return found


def may_bind(text: str) -> bool:
    """Whether a module of text `text` may bind a shortcut (`pmap = functools.partial(jax.pmap,
    ...)` at its level): modules that cannot are not parsed for one."""
    return "pmap" in text and BINDING.search(text) is not None


def _respelled(
    value: cst.BaseExpression, read: frozenset[str], reach: str | None
) -> cst.BaseExpression:
    """`value` of a shortcut, its module's names reached through `reach` (`constants.X`)."""
    if reach is None or not read:
        return value
    names = [n for n in nodes_in(value, cst.Name) if n.value in read]
    return replaced(value, {id(n): cst.Attribute(cst.Name(reach), n) for n in names})
