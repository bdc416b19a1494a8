"""Build the requests sent to workers: the target, its inputs, and its mesh contexts per side.

A call's context is the list of mesh-like `with` statements that enclosed it (from the recording,
or else from the first call of the target in its own file that runs under one). Each side takes
them from its own text: the original's recorded `with mesh:`; the rewrite's around each recorded
caller's line as the rewrite has it (`Source.counterpart`: a `with jax.set_mesh(mesh):` the
rewrite added counts, one it dropped does not), or, without recorded callers, the original's
`with` lines mapped through the diff.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from jaxmigrate.pipeline.engine import line_map_between
from jaxmigrate.toolkit.facts import parse
from jaxmigrate.verify.child.protocol import (
    SCRIPT,
    Context,
    Inputs,
    Module,
    Returned,
    RunCandidate,
    RunOriginal,
    Target,
)
from jaxmigrate.verify.child.source import (
    MeshWith,
    call_site_withs,
    enclosing_withs,
    local_bindings,
    with_at,
)
from jaxmigrate.verify.planner import Plan, reach_spans
from jaxmigrate.verify.recording import Recorded
from jaxmigrate.verify.targets import Kind
from jaxmigrate.verify.workspace import Workspace, module_name


@dataclass(frozen=True)
class Source:
    """One file as the original and the candidate have it."""

    original: str
    candidate: str

    @cached_property
    def trees(self) -> tuple[ast.Module | None, ast.Module | None]:
        return parse(self.original), parse(self.candidate)

    @cached_property
    def forward(self) -> dict[int, int]:
        """Map original line numbers to candidate line numbers."""
        back = line_map_between(self.original.splitlines(keepends=True), self.candidate)
        out: dict[int, int] = {}
        for line in range(1, len(self.candidate.splitlines()) + 1):
            out.setdefault(back(line), line)
        return out

    @cached_property
    def hunks(self) -> Sequence[tuple[str, int, int, int, int]]:
        """The diff's opcodes from the original's lines to the candidate's."""
        orig, cand = self.original.splitlines(), self.candidate.splitlines()
        return difflib.SequenceMatcher(None, orig, cand, autojunk=False).get_opcodes()

    def counterpart(self, line: int) -> int | None:
        """Return the candidate's line that original `line` became: the same line where the diff
        kept it, else the most alike line of the candidate's side of its hunk (a call whose
        arguments changed, indented under a `with` the rewrite added); None if it went."""
        orig, cand = self.original.splitlines(), self.candidate.splitlines()
        for tag, i1, i2, j1, j2 in self.hunks:
            if not i1 < line <= i2:
                continue
            if tag == "equal":
                return j1 + line - i1
            if j1 == j2:
                return None
            text = orig[line - 1].strip()
            ratios = [
                difflib.SequenceMatcher(None, text, cand[j].strip()).ratio() for j in range(j1, j2)
            ]
            return j1 + ratios.index(max(ratios)) + 1
        return None

    def withs(self, line: int) -> tuple[MeshWith | None, MeshWith | None]:
        """Return the `with` at original `line` as each side has it."""
        orig_tree, cand_tree = self.trees
        orig = with_at(orig_tree, self.original, line) if orig_tree else None
        mapped = self.forward.get(line)
        cand = with_at(cand_tree, self.candidate, mapped) if cand_tree and mapped else None
        return orig, cand


@dataclass(frozen=True)
class Sources:
    """The texts of every file a run may look at, per side."""

    root: Path
    originals: Mapping[str, str]
    candidates: Mapping[str, str]
    # each file read, parsed and diffed once per run, not once per plan and frame
    known: dict[str, Source | None] = field(default_factory=dict, compare=False, repr=False)

    def get(self, relpath: str) -> Source | None:
        if relpath not in self.known:
            self.known[relpath] = self._read(relpath)
        return self.known[relpath]

    def _read(self, relpath: str) -> Source | None:
        original = self.originals.get(relpath)
        if original is None:
            try:
                original = (self.root / relpath).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return None
        return Source(original, self.candidates.get(relpath, original))


def module_spec(root: Path, relpath: str, text: str | None) -> Module:
    """Return how a worker finds a module: dotted name, file, sys.path entry, optional text."""
    name, entry = module_name(root, relpath)
    return Module(module=name, file=relpath, path=entry, text=text)


def static_withs(plan: Plan) -> tuple[tuple[str, int], ...]:
    """Return the contexts of the first call of the target in its own file that has one."""
    tree = parse(plan.request.original)
    if tree is None:
        return ()
    found = call_site_withs(tree, plan.request.original, plan.target.qualname)
    return tuple((plan.path, w.line) for w in found)


def context_messages(
    withs: Sequence[tuple[str, int]],
    sources: Sources,
    frames: Sequence[tuple[str, int]] = (),
) -> tuple[list[Context], list[Context]]:
    """Return the contexts to enter on the original side and on the candidate side.

    The original's are the `with` statements recorded around the call. The candidate's, when
    the call's callers were recorded (`frames`), are those around each caller's line in the
    rewritten text: a `with jax.set_mesh(mesh):` the rewrite put around a loop calling a
    step a factory made counts too. Else each recorded `with` as the rewrite has it."""
    orig: list[Context] = []
    cand: list[Context] = []
    for relpath, line in withs:
        source = sources.get(relpath)
        if source is None:
            continue
        orig_with, cand_with = source.withs(line)
        if orig_with is not None:
            spec = module_spec(sources.root, relpath, None)
            orig.append(Context(module=spec, exprs=list(orig_with.exprs)))
        if cand_with is not None and not frames:
            cand.append(candidate_context(sources, relpath, source, cand_with))
    for relpath, line in frames:
        source = sources.get(relpath)
        tree = source.trees[1] if source is not None else None
        mapped = source.counterpart(line) if source is not None else None
        if source is None or tree is None or mapped is None:
            continue
        for found in enclosing_withs(tree, source.candidate, mapped):
            cand.append(candidate_context(sources, relpath, source, found))
    return orig, cand


def candidate_context(sources: Sources, relpath: str, source: Source, found: MeshWith) -> Context:
    """The rewrite's `with` statement `found` in `relpath` as a context to enter, with the
    locals it reads that its function assigns before it."""
    tree = source.trees[1]
    bindings = local_bindings(tree, source.candidate, found.line) if tree is not None else []
    spec = module_spec(sources.root, relpath, sources.candidates.get(relpath))
    return Context(module=spec, exprs=list(found.exprs), bindings=bindings)


@dataclass(frozen=True)
class Task:
    """One plan in one round: the requests for both sides."""

    plan: Plan
    original: RunOriginal
    candidate: RunCandidate


def make_task(
    plan: Plan,
    candidate_text: str,
    recorded: Recorded | None,
    sources: Sources,
    ws: Workspace,
    synthesize: bool,
    devices: int,
) -> Task:
    """Return the original and candidate requests for `plan` against `candidate_text`."""
    withs = recorded.contexts if recorded else static_withs(plan)
    orig_ctx, cand_ctx = context_messages(withs, sources, recorded.frames if recorded else ())
    spec = module_spec(sources.root, plan.path, None)
    target = Target(
        module=spec.module,
        file=spec.file,
        path=spec.path,
        qualname=plan.target.qualname,
        call_as=plan.target.jitted_as or None,  # a function the program only runs jitted
    )
    layouts = [
        s.details["layout"]
        | rewritten_step(candidate_text, plan.target.qualname, s.details, plan.request.original)
        for s in plan.sites
        if "layout" in s.details
    ]  # program-level pmap rewrites: what they assume, checked on the original
    returned = recorded.returned if recorded else None
    orig_ret, cand_ret = context_messages(
        returned.contexts if returned else (), sources, returned.frames if returned else ()
    )
    meshes = list(returned.meshes) if returned else []
    common: dict[str, Any] = {
        "meshes": list(recorded.meshes) if recorded else [],
        "inputs_path": str(ws.io / f"{plan.id}.inputs.pkl"),
        "outputs_path": str(ws.io / f"{plan.id}.outputs.pkl"),
        "pristine": str(sources.root),  # to lay back a file a unit changed (`child/shown.py`)
        "layouts": layouts,
    }
    original = RunOriginal(
        **common,
        target=replace(target, baseline=plan.request.baseline or None),
        contexts=orig_ctx,
        references=list(plan.references),
        inputs=Inputs(
            recorded=list(recorded.files) if recorded else [],
            synthesize=synthesize,
            structure=plan.target.structure,
            devices=devices,
        ),
        reach=reach_spans(plan) if plan.target.kind is Kind.FUNCTION else [],
        returned=Returned(
            recorded=list(returned.files) if returned else [], contexts=orig_ret, meshes=meshes
        ),
    )
    candidate = RunCandidate(
        **common,
        target=replace(target, text=candidate_text),
        contexts=cand_ctx,
        returned=Returned(contexts=cand_ret, meshes=meshes),
        records=list(recorded.files) if recorded else [],  # for their import paths
    )
    return Task(plan, original, candidate)


def rewritten_step(
    text: str, qualname: str, details: dict[str, Any], original: str = ""
) -> dict[str, int]:
    """Return where the rewrite makes a program-level step, `jax.jit(jax.shard_map(body, ...))`
    in the target function (`candidate_line`, `candidate_end_line`), or nothing when it does not
    (the step is then only checked, its calls not compared).

    Two steps may map one body (`p_train = jax.pmap(update)`, `p_eval = jax.pmap(update)`): the
    one assigned to the name the `original` assigned on the step's line is taken, so that each
    step's calls are compared with its own rewrite's (the first step's matched both, and the
    group fell back to the faithful form, PL603, on calls missing).
    """
    tree = parse(text)
    body = details["layout"].get("body")
    name = assigned_at(original, details["layout"].get("line"))
    nodes = _units_then_module(tree, qualname)
    named = [
        node
        for node in nodes
        if isinstance(node, ast.Assign)
        and _is_step(node.value, body)
        and name in {ast.unparse(t) for t in node.targets}
    ]
    for node in [*named[:1], *nodes]:
        if isinstance(node, ast.Assign) and _is_step(node.value, body):
            end = node.value.end_lineno or node.value.lineno
            return {"candidate_line": node.value.lineno, "candidate_end_line": end}
        jit = _jit_decorator(node, body)
        if jit is not None:  # `@jax.jit` over `@partial(jax.shard_map, ...)` on `def body`
            return {
                "candidate_line": jit.lineno,
                "candidate_end_line": jit.end_lineno or jit.lineno,
            }
    return {}


def _units_then_module(tree: ast.Module | None, qualname: str) -> list[ast.AST]:
    """Return the nodes of the unit `qualname`, then of the whole module: a step made at module
    level (`_outer`), in a function the unit calls, or stored on `self` by a method."""
    if tree is None:
        return []
    unit: ast.AST | None = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == qualname
        ),
        tree if qualname == SCRIPT else None,
    )
    return [*(ast.walk(unit) if unit is not None else ()), *ast.walk(tree)]


def assigned_at(text: str, line: int | None) -> str:
    """Return what the one-target assignment holding `line` of `text` assigns (`p_eval`,
    `self.step`), or ''."""
    tree = parse(text) if text and line else None
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Assign) or len(node.targets) != 1 or line is None:
            continue
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return ast.unparse(node.targets[0])
    return ""


def _jit_decorator(node: ast.AST, body: str | None) -> ast.expr | None:
    """The outer `jax.jit` decorator (maybe through `partial`) of the def `body`, when the
    next one maps it with `jax.shard_map`: the decorated program-level step; else None."""
    if not isinstance(node, ast.FunctionDef) or node.name != body or len(node.decorator_list) < 2:
        return None
    outer, inner = node.decorator_list[:2]

    def names(expr: ast.expr) -> list[str]:
        return [n.attr for n in ast.walk(expr) if isinstance(n, ast.Attribute)]

    jitted = "jit" in names(outer) and "shard_map" not in names(outer)
    return outer if jitted and "shard_map" in names(inner) else None


def _is_step(node: ast.expr, body: str | None) -> bool:
    """`jax.jit(jax.shard_map(body, ...), ...)`, spelled through any alias of `jax`."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    inner = node.args[0]
    return (
        isinstance(node.func, ast.Attribute)
        and node.func.attr == "jit"
        and isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr == "shard_map"
        and bool(inner.args)
        and body is not None
        and _same_code(inner.args[0], body)
    )


def _same_code(node: ast.expr, text: str) -> bool:
    """Return True if `node` is the expression `text` (a name, or a lambda around the body),
    whatever its layout."""
    if isinstance(node, ast.Name):
        return node.id == text
    try:
        return ast.unparse(node) == ast.unparse(ast.parse(text, mode="eval").body)
    except SyntaxError:
        return False
