"""Plan the verification of each unsafe site: its target, its module, and its references.

Sites whose targets coincide (a `with mesh:` and the pjit call inside the same function) share
one plan, run once. A site whose target cannot be called on its own gets its verdict here.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.registry import all_passes
from jaxmigrate.verify.child.protocol import SCRIPT
from jaxmigrate.verify.config import Verdict, VerifyRequest
from jaxmigrate.verify.targets import (
    Kind,
    Target,
    assigned_names,
    chain_at,
    find_target,
    header_end,
    site_span,
    start_line,
    statement_span,
    unit_of,
)
from jaxmigrate.verify.workspace import module_name

ORIGINAL = "original"
SAFE_REWRITES = "safe-rewrites"
HAND_MIGRATION = "hand-migration"  # the sites of `verify --against`
# The reference to fall back on when the original raises: per pass, its `REFERENCE`; for a
# hand-made change, per legacy API its source mentions (cookbook, "Notes for the verifier").
REFERENCE_BY_TEXT = {
    "pmap": "vmap-oracle",
    "axis_resources": "pjit-in-shardings",
    "shard_map": "widened-shard-map",
}


@dataclass(frozen=True)
class Plan:
    """How to verify the sites of one target."""

    id: str
    request: VerifyRequest
    sites: tuple[Site, ...]
    target: Target
    module: str
    entry: str
    references: tuple[str, ...]
    # The function making the program-level group this plan's sites serve, when they are all
    # in another function it passes the program's values to (`save_checkpoint(state)`): its
    # calls, recorded or made up in the original's layout, cannot judge them alone
    program_host: str = ""

    @property
    def path(self) -> str:
        return self.request.path

    @property
    def label(self) -> str:
        return f"{self.path}::{self.target.qualname}"


def reference_by_pass() -> dict[str, str]:
    """Return the verification reference of every pass that has one, by pass name."""
    return {p.NAME: p.REFERENCE for p in all_passes() if p.REFERENCE is not None}


def references_for(
    sites: Sequence[Site], target: Target, text: str, baseline: bool
) -> tuple[str, ...]:
    """Return the references to try, in order: the original first unless it is known wrong.

    With a `baseline` (the original with its safe sites rewritten), each is tried again on it.
    """
    by_pass = reference_by_pass()
    found = [by_pass[s.name] for s in sites if s.name in by_pass]
    found += [ref for word, ref in REFERENCE_BY_TEXT.items() if word in text]
    # 0.10.2's pmap mishandles negative axes (cookbook case 04): never trust it there.
    negative = bool(target.structure.get("negative_axes"))
    plain = ["vmap-oracle"] if negative else [ORIGINAL, *dict.fromkeys(found)]
    if not baseline:
        return tuple(plain)
    safe = [SAFE_REWRITES if p == ORIGINAL else f"{SAFE_REWRITES}+{p}" for p in plain]
    return tuple(plain + safe)


def plan_file(
    request: VerifyRequest, root: Path, start: int, record: bool = False
) -> tuple[list[Plan], dict[str, Verdict]]:
    """Return the plans for a file's unsafe sites, and verdicts for sites needing no run.

    Sites only the program reaches (`bound`) are planned when a command is `record`ed.
    """
    tree = ast.parse(request.original)
    verdicts: dict[str, Verdict] = {}
    grouped: dict[str, tuple[Target, list[Site]]] = {}
    scripted = script_groups(request.sites)  # a notebook's too: its cells as one script
    programs = {s.group for s in request.sites if s.group_step}
    for site in request.sites:
        if site.safety is Safety.SAFE:
            verdicts[site.key] = Verdict(Status.NOT_NEEDED, "safe rewrite")
            continue
        if site.group in scripted:  # the module run as a program is the group's unit
            grouped.setdefault(SCRIPT, (script_target(tree), []))[1].append(site)
            continue
        if site.details.get("deleted") and site.group in programs:
            continue  # runs in no rewrite: judged with its group (`session.with_deleted`)
        target = find_target(tree, site.line)
        if request.command:  # a notebook: its program is the unit, whatever the target
            target = replace(target, kind=Kind.BOUND)
        if target.kind is Kind.BOUND and (record or request.command):
            key = f"{target.qualname}@{target.first}"
            grouped.setdefault(key, (target, []))[1].append(site)
            continue
        if site.group in programs and site.name != HAND_MIGRATION:
            # A site of a program-level group is judged through its unit (a `main()` using the
            # function or class it is in), which runs the program as it runs: the step takes
            # the flat layout its program passes, on the mesh its program sets (maybe in the
            # unit: a step made outside the functions calling it), so a step, or a function
            # calling it, run alone on synthesized inputs may differ by design.
            used = target.qualname.split(".")[0]
            if unit_of(tree, used) not in (None, target.qualname):
                add_to_unit(tree, target, site, grouped, used=used)
                continue
        if not target.reachable:
            # a method's site (the class needs an instance) is judged by the `main()` using
            # its class, where there is one
            used = target.qualname.split(".")[0]
            unit = site.name != HAND_MIGRATION and method_need(tree, site.line) is not None
            if not (unit and add_to_unit(tree, target, site, grouped, used=used)):
                verdicts[site.key] = Verdict(Status.UNVERIFIED, unreachable_reason(target))
            continue
        grouped.setdefault(target.qualname, (target, []))[1].append(site)
        if site.name != HAND_MIGRATION and not request.command and site.group not in programs:
            add_to_unit(tree, target, site, grouped)
    module, entry = module_name(root, request.path)
    hosts = program_hosts(tree, request.sites)
    plans = [
        Plan(
            id=f"t{start + n}",
            request=request,
            sites=tuple(sites),
            target=target,
            module=module,
            entry=entry,
            references=references_for(
                sites, target, request.original, request.baseline not in (None, request.original)
            ),
            program_host=served_host(target, sites, hosts),
        )
        for n, (target, sites) in enumerate(grouped.values())
    ]
    return plans, verdicts


def program_hosts(tree: ast.Module, sites: Sequence[Site]) -> dict[str, str]:
    """By program-level group: the function its steps are in (making and calling them), where
    they are all in one."""
    found: dict[str, set[str]] = {}
    for site in sites:
        if site.group is not None and site.group_step:
            found.setdefault(site.group, set()).add(find_target(tree, site.line).qualname)
    return {group: next(iter(names)) for group, names in found.items() if len(names) == 1}


def served_host(target: Target, sites: Sequence[Site], hosts: dict[str, str]) -> str:
    """The function making the program-level group every one of `sites` serves from another
    function, `target` (a readback deleted in `save_checkpoint(state)`, called with the
    program's state); "" otherwise."""
    found = {hosts.get(s.group or "", "") for s in sites if not s.group_step}
    if len(found) != 1 or any(s.group_step for s in sites):
        return ""
    host = found.pop()
    return host if host and host != target.qualname and target.kind is Kind.FUNCTION else ""


def script_groups(sites: Sequence[Site]) -> set[str]:
    """The program-level pmap groups made and called outside any function (the step site's
    `layout` says `script`: a script's statements, its `__main__` block, a notebook's cells):
    no function runs them but the module (a notebook's cells as one script) run as a
    program."""
    return {
        s.group for s in sites if s.group is not None and s.details.get("layout", {}).get("script")
    }


def script_target(tree: ast.Module) -> Target:
    """The module itself, run as `python file.py` (its statements, then its main block)."""
    last = max((node.end_lineno or node.lineno for node in tree.body), default=1)
    return Target(Kind.FUNCTION, SCRIPT, 1, 0, structure={"last": last})


def add_to_unit(
    tree: ast.Module,
    target: Target,
    site: Site,
    grouped: dict[str, tuple[Target, list[Site]]],
    used: str | None = None,
) -> bool:
    """Verify a site of a module-level callable or function also by running its unit (a
    `main()` using it, or using `used`: the function or class the site is in; a method's site
    only there, its class needing an instance): its own inputs may not be synthesizable (a
    matmul's shapes), or not be how the program calls it; the program's are its real ones.
    `reach_spans` says which lines the unit's run must run. Return whether there is a unit.
    (A definition changed by hand, `verify --against`, is judged on its own: a unit would mix
    its change with the unit's own.)"""
    name = used or target.qualname
    if "." in name:
        return False
    unit = unit_of(tree, name)
    if unit is None or unit == target.qualname:
        return False
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == unit)
    made = Target(Kind.FUNCTION, unit, start_line(node), header_end(node))
    grouped.setdefault(unit, (made, []))[1].append(site)
    return True


def reach_spans(plan: Plan) -> list[Any]:
    """Return, per site of a function target, what a call must run to show something about it.

    A call of the function around a site that never runs the site (another branch) agrees on
    both sides whatever the rewrite did; the worker watches for these lines: `[first, last]`,
    the site's statement in the function's body, or in the body of another function of the
    module the unit holds a site of (a group's edits in a helper it calls), or in a method of
    a class it uses (`method_need`). A module-level
    callable a `main()` unit uses
    (`@partial(jax.pmap, ...) def step`, `step = jax.pmap(f)`) is created at import, so a run
    of the unit shows something about it only if it calls it, that is if the function it maps
    runs: `{"spans": [...], "name": "step"}`, the lines of that function's body (and of the
    assignment, where a lambda is mapped). A site on the function's own header (a definition
    changed by hand) runs with every call, and is not watched.
    """
    try:
        tree = ast.parse(plan.request.original)
    except SyntaxError:
        return []
    body = body_lines(tree, plan.target)
    if body is None:
        return []
    lines = sorted({s.line for s in plan.sites if body[0] <= s.line <= body[1]})
    spans = [site_span(tree, line) for line in lines]
    found: list[Any] = [list(span) for span in dict.fromkeys(spans)]
    outside = [find_target(tree, s.line) for s in plan.sites if not body[0] <= s.line <= body[1]]
    # a site in the body of another function the unit calls (a program-level group's edits in
    # flax lm1b's `evaluate`): a run that never calls it, or takes another path there, shows
    # nothing about it either
    for site in plan.sites:
        other = find_target(tree, site.line)
        held = body_lines(tree, other) if other.kind is Kind.FUNCTION else None
        need = method_need(tree, site.line) if other.kind is Kind.BOUND else None
        if need is not None and need not in found:
            found.append(need)
        elif held and held[0] <= site.line <= held[1] and other.qualname != plan.target.qualname:
            span = list(site_span(tree, site.line))
            if span not in found:
                found.append(span)
    used = {t.qualname for t in outside if t.kind is Kind.CALLABLE and "." not in t.qualname}
    for name in sorted(used - {plan.target.qualname}):
        called = callable_lines(tree, name)
        if called:
            found.append({"spans": [list(span) for span in called], "name": name})
    return found


def method_need(tree: ast.Module, line: int) -> Any:
    """Return what a run of a unit must run to show something about a site at `line` in a
    module-level class: the site's statement in a method's body, or the body of the method
    whose decorator or header holds it (`{"spans": [...], "name": "Trainer.step"}`: decorated
    when the class is made, it runs when called); None for a statement of the class's body
    (it runs when the module is imported, before any unit)."""
    chain = chain_at(tree, line)
    if not chain or not isinstance(chain[0], ast.ClassDef):
        return None
    defs = [n for n in chain if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs:
        return None
    method = defs[0]
    if line > header_end(method):
        return list(site_span(tree, line))
    body = [header_end(method) + 1, method.end_lineno or method.lineno]
    return {"spans": [body], "name": f"{chain[0].name}.{method.name}"}


def module_def(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def def_body(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    return node.body[0].lineno, node.end_lineno or node.lineno


def mapped_names(expr: ast.expr) -> list[str]:
    """Return the names a legacy call maps: `f` in `jax.pmap(f)`, `jax.jit(jax.shard_map(f,
    ...))` or `jax.pmap(functools.partial(f, ...))`."""
    names: list[str] = []
    while isinstance(expr, ast.Call) and expr.args:
        expr = expr.args[0]
        if isinstance(expr, ast.Name):
            names.append(expr.id)
    return names


def uses(tree: ast.Module, name: str) -> int:
    """Return how many times the module reads the name `name`."""
    return sum(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for n in ast.walk(tree)
    )


def callable_lines(tree: ast.Module, name: str) -> list[tuple[int, int]]:
    """Return the lines whose running shows that the module-level callable `name` was called:
    the body of the decorated `def name`, or of the functions `name = jax.pmap(f)` maps (and the
    assignment's own lines, for a lambda); none when they are not in the file (`jax.pmap(g)`
    of an imported `g`: nothing is watched)."""
    node = module_def(tree, name)
    if node is not None:
        return [def_body(node)]
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and name in assigned_names(stmt):
            value = stmt.value
            if not isinstance(value, ast.Call):
                return []
            lambdas = any(isinstance(n, ast.Lambda) for n in ast.walk(value))
            spans = [statement_span(stmt)] if lambdas else []
            for mapped in mapped_names(value):
                found = module_def(tree, mapped)
                if found is not None and uses(tree, mapped) == 1:  # runs only as `name`
                    spans.append(def_body(found))
            return spans
    return []


def body_lines(tree: ast.Module, target: Target) -> tuple[int, int] | None:
    """Return the lines of a function target's body, after its header (None if not found);
    the module run as a program (`SCRIPT`): all of it."""
    if target.qualname == SCRIPT:
        return 1, max((node.end_lineno or node.lineno for node in tree.body), default=1)
    for node in tree.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == target.qualname
        ):
            return target.last + 1, node.end_lineno or node.lineno
    return None


def unreachable_reason(target: Target) -> str:
    """Return why a site cannot be run alone, and how it could be verified."""
    reason = f"cannot be run alone: {target.why}"
    if target.kind is Kind.BOUND:
        reason += (
            "; pass --verify-with with tests that reach it: their calls of it are recorded "
            "on the original and on the rewritten tree and compared"
        )
    return reason


def plan_all(
    requests: Sequence[VerifyRequest], root: Path, record: bool = False
) -> tuple[list[Plan], dict[tuple[str, str], Verdict]]:
    """Return the plans for every request, and the verdicts decided without running."""
    plans: list[Plan] = []
    verdicts: dict[tuple[str, str], Verdict] = {}
    for request in requests:
        try:
            more, decided = plan_file(request, root, len(plans), record)
        except SyntaxError as exc:
            reason = f"the original does not parse: {exc.msg} (line {exc.lineno})"
            decided = {s.key: Verdict(Status.UNVERIFIED, reason) for s in request.sites}
            more = []
        plans += more
        verdicts.update({(request.path, key): v for key, v in decided.items()})
    return plans, verdicts
