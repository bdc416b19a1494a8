"""Find a site's target: the callable whose outputs show whether the rewrite kept behaviour.

From the source around the site's line:

- a decorated module-level `def` -> that function (`callable`);
- `name = jax.pmap(...)` at module level -> `name` (`callable`);
- a module-level plain `def` whose body holds the site -> that function (`function`);
- anything inside a module-level function (inline `jax.pmap(f)(x)`, a local decorated `def`, a
  local `step = pjit(...)`, a `with mesh:`) -> the enclosing module-level function (`function`);
- `self.attr = ...`, methods (of a model class, of a `TestCase`), class attributes and
  module-level statements cannot be called on their own: the target is `bound` to the program.
  With `--verify-with`, the command itself is the unit: the calls of the callable created on
  the site's statement are recorded on both trees and compared (see `verify.bound`); without
  it the site stays unverified, with the reason.

Callable targets are recorded where the legacy API creates them (their `span`); function targets
by wrapping the module attribute. Both can be replayed with recorded, declared or synthesized
inputs. A module-level callable also has a *unit* when the module has one: a module-level
function that takes no arguments (a `main()`, a training program) and uses it, directly or
through the module's other functions; running the unit on both sides verifies the callable as
the program uses it, when its own inputs cannot be synthesized (a dict batch, a `TrainState`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


class Kind(StrEnum):
    """How a target is reached."""

    CALLABLE = "callable"
    FUNCTION = "function"
    BOUND = "bound"  # only the recorded command can reach it: compared by recording both trees
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Target:
    """The callable to run for a site, where it is created, and hints to synthesize inputs."""

    kind: Kind
    qualname: str
    first: int
    last: int
    why: str = ""
    structure: dict[str, Any] = field(default_factory=dict)
    jitted_as: str = ""  # a function the module only uses as `step = jax.jit(f)`: call `step`

    @property
    def reachable(self) -> bool:
        return self.kind not in (Kind.UNREACHABLE, Kind.BOUND)


def start_line(node: ast.AST) -> int:
    """Return the first line of a statement, counting its decorators."""
    decorators = getattr(node, "decorator_list", None) or []
    return min([d.lineno for d in decorators] + [getattr(node, "lineno", 0)])


def header_end(node: ast.stmt) -> int:
    """Return the last line of a statement's header (a def's line), or its last line."""
    if isinstance(node, (*DEFS, ast.ClassDef)):
        return node.body[0].lineno - 1 if node.body[0].lineno > node.lineno else node.lineno
    return node.end_lineno or node.lineno


def chain_at(tree: ast.Module, line: int) -> list[ast.AST]:
    """Return the statements containing `line`, from the module level inward."""
    chain: list[ast.AST] = []
    node: ast.AST = tree
    while True:
        child = next(
            (
                c
                for c in ast.iter_child_nodes(node)
                if isinstance(c, BLOCKS)
                and start_line(c) <= line <= (getattr(c, "end_lineno", 0) or 0)
            ),
            None,
        )
        if child is None:
            return chain
        chain.append(child)
        node = child


def method_at(tree: ast.Module, line: int) -> tuple[str, int] | None:
    """Return `Class.method` and the last line of its header, when `line` is in a method of a
    module-level class (not in a function nested in it, nor in an `async def`), else None."""
    chain = chain_at(tree, line)
    named = [n for n in chain if isinstance(n, (*DEFS, ast.ClassDef))]
    if len(named) != 2 or chain[0] is not named[0] or not isinstance(named[0], ast.ClassDef):
        return None
    method = named[1]
    if not isinstance(method, ast.FunctionDef) or method not in named[0].body:
        return None
    return f"{named[0].name}.{method.name}", header_end(method)


def unreachable(qualname: str, why: str) -> Target:
    return Target(Kind.UNREACHABLE, qualname, 0, 0, why=why)


def statement_span(stmt: ast.AST) -> tuple[int, int]:
    """Return the lines of a statement that can create a callable: a compound's header only."""
    if isinstance(stmt, (*DEFS, ast.ClassDef)):
        return start_line(stmt), header_end(stmt)  # type: ignore[arg-type]
    body = getattr(stmt, "body", None)
    first = start_line(stmt)
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
        return first, max(first, body[0].lineno - 1)
    return first, getattr(stmt, "end_lineno", None) or first


def site_span(tree: ast.Module, line: int) -> tuple[int, int]:
    """Return the lines whose running shows that the site at `line` ran: its statement's."""
    chain = chain_at(tree, line)
    if not chain:
        return line, line
    first, last = statement_span(chain[-1])
    return (first, last) if first <= line <= last else (line, line)


def bound(chain: list[ast.AST], line: int, why: str) -> Target:
    """Return the target of a site only the recorded program reaches: its statement's lines."""
    names = [n.name for n in chain if isinstance(n, (*DEFS, ast.ClassDef))]
    inner = chain[-1]
    first, last = statement_span(inner)
    if not first <= line <= last:  # the site is in a nested body: the innermost statement
        first, last = line, line
    label = ".".join(names) or f"line {line}"
    return Target(Kind.BOUND, label, first, last, why=why)


def find_target(tree: ast.Module, line: int) -> Target:
    """Return the target of the site at `line`."""
    chain = chain_at(tree, line)
    if not chain:
        return unreachable("", "the site is not inside a statement")
    top, inner = chain[0], chain[-1]
    if isinstance(top, ast.ClassDef):
        why = f"the site is in class `{top.name}`: it needs an instance"
        return bound(chain, line, why)
    if isinstance(top, DEFS):
        in_header = inner is top and line <= header_end(top)
        if in_header and top.decorator_list:
            return callable_target(top.name, top)
        jitted = jitted_as(tree, top.name)
        return Target(Kind.FUNCTION, top.name, start_line(top), header_end(top), jitted_as=jitted)
    return module_statement_target(top, chain, line)


def is_jit(node: ast.expr) -> bool:
    name = dotted(node) or ""
    return name == "jit" or name.endswith(".jit")


def jitted_as(tree: ast.Module, name: str) -> str:
    """Return `step` when the module uses the function `name` only as `step = jax.jit(name, ...)`
    (module level), else ''.

    Such a function runs only traced, as the program runs it: its rewrite may rely on that (a
    `jax.shard_map` without `mesh=` nested in it takes the mesh of the trace), so it is called
    through `step`.
    """
    made = [
        stmt.targets[0].id
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.Call)
        and is_jit(stmt.value.func)
        and stmt.value.args
        and isinstance(stmt.value.args[0], ast.Name)
        and stmt.value.args[0].id == name
    ]
    uses = sum(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for n in ast.walk(tree)
    )
    return made[0] if len(made) == 1 and uses == 1 else ""


def module_statement_target(stmt: ast.AST, chain: list[ast.AST], line: int) -> Target:
    """Return the target of a site in a module-level statement that is not a def."""
    names = assigned_names(stmt)
    value = getattr(stmt, "value", None)
    made = isinstance(value, (ast.Call, ast.Lambda))  # a tuple or dict of them is not callable
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and len(names) == 1 and made:
        return callable_target(names[0], stmt)
    return bound(chain, line, "the site is in module-level code, not in a function")


def assigned_names(stmt: ast.AST) -> list[str]:
    """Return the plain names an assignment binds (none for attributes or unpacking)."""
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def callable_target(name: str, stmt: ast.stmt) -> Target:
    """Return a callable target created by `stmt` (a decorated def or an assignment)."""
    return Target(
        Kind.CALLABLE, name, start_line(stmt), header_end(stmt), structure=structure(stmt)
    )


def legacy_calls(stmt: ast.stmt) -> list[ast.Call]:
    """Return the calls in a statement's header (decorators, or the assigned value)."""
    parts: list[ast.AST] = list(getattr(stmt, "decorator_list", []))
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
        parts.append(stmt.value)
    return [n for part in parts for n in ast.walk(part) if isinstance(n, ast.Call)]


def dotted(node: ast.expr) -> str | None:
    """Return `a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def is_pmap_call(call: ast.Call) -> bool:
    """Return True for `pmap(...)`, `jax.pmap(...)` or `partial(jax.pmap, ...)`."""
    names = [dotted(call.func) or ""]
    if call.args:
        names.append(dotted(call.args[0]) or "")
    return any(n == "pmap" or n.endswith(".pmap") for n in names)


def has_negative(node: ast.AST) -> bool:
    """Return True if a literal holds a negative number."""
    return any(isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) for n in ast.walk(node))


def structure(stmt: ast.stmt) -> dict[str, Any]:
    """Return what the legacy call tells about the target's arguments (for synthesis)."""
    pmaps = [c for c in legacy_calls(stmt) if is_pmap_call(c)]
    if not pmaps:
        return {"kind": "array"}
    keywords = {k.arg: k.value for c in pmaps for k in c.keywords if k.arg}
    out: dict[str, Any] = {"kind": "pmap", "in_axes": 0}
    if "in_axes" in keywords:
        try:
            out["in_axes"] = ast.literal_eval(keywords["in_axes"])
        except ValueError:
            out["in_axes"] = "?"
    if isinstance(keywords.get("axis_size"), ast.Constant):
        out["axis_size"] = keywords["axis_size"].value  # type: ignore[attr-defined]
    out["statics"] = "static_broadcasted_argnums" in keywords
    out["negative_axes"] = any(
        has_negative(keywords[k]) for k in ("in_axes", "out_axes") if k in keywords
    )
    return out


def takes_no_arguments(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Return True if `node` can be called as `node()`: every parameter has a default."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    kw_defaults = [d for d in args.kw_defaults if d is None]
    return len(args.defaults) == len(positional) and not kw_defaults


def unit_of(tree: ast.Module, name: str) -> str | None:
    """Return the module-level function without arguments that uses `name` (directly or through
    the module's other functions and classes: a method calling a step), preferring `main`; None
    if there is none."""
    defs: dict[str, ast.FunctionDef | ast.ClassDef] = {
        n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    uses = {
        f: {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for f, node in defs.items()
    }

    def reaches(start: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            names = uses[todo.pop()]
            if name in names:
                return True
            todo += [f for f in names & defs.keys() if f not in seen]
            seen |= names & defs.keys()
        return False

    units = [
        f
        for f, node in defs.items()
        if f != name and isinstance(node, ast.FunctionDef) and takes_no_arguments(node)
    ]
    found = [f for f in units if reaches(f)]
    return "main" if "main" in found else (found[0] if found else None)
