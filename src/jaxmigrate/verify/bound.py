"""Sites only the program reaches (methods, `TestCase`s, module code): the command is the unit.

The `--verify-with` command runs on the original copy (with the other recordings) and again on
the rewritten copy; on each, the callable created on the site's statement records its first
calls with their outputs. A site is verified when the rewritten run made the calls the original
run made, on the same inputs, with agreeing outputs; failed when its outputs differ, or when it
made fewer calls and the command failed on the rewritten tree; unverified when the original run
made no call, or when the runs' inputs diverged before the site.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jaxmigrate.model import Status
from jaxmigrate.toolkit.facts import parse
from jaxmigrate.verify.child import protocol
from jaxmigrate.verify.child.protocol import (
    CompareRecords,
    Failed,
    RecordPlan,
    RecordsCompared,
    encode,
)
from jaxmigrate.verify.config import Verdict, VerifyConfig
from jaxmigrate.verify.judge import no_call
from jaxmigrate.verify.planner import Plan, body_lines
from jaxmigrate.verify.pool import Worker
from jaxmigrate.verify.recording import (
    Printed,
    Recorded,
    Recording,
    collect,
    helpers,
    method_watch,
    printed,
    run_command,
    scratch,
)
from jaxmigrate.verify.targets import Kind, bound, chain_at, start_line, statement_span
from jaxmigrate.verify.workspace import Workspace


@dataclass(frozen=True)
class Rerun:
    """The command's run on the rewritten copy: the calls it recorded, and how it ended."""

    calls: dict[str, Recorded]
    error: str
    unplaced: dict[str, str]
    printed: Printed = ()  # its standard output, per process


BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def signature(node: ast.AST) -> str:
    """Return what identifies a statement across a rewrite: its kind, and its name or targets."""
    kind = type(node).__name__
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return f"{kind}:{node.name}"
    if isinstance(node, ast.Assign):
        return f"{kind}:" + ",".join(ast.unparse(t) for t in node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return f"{kind}:{ast.unparse(node.target)}"
    return kind


def path_to(node: ast.AST, first: int) -> list[tuple[str, int]] | None:
    """Return the (body field, index) steps from `node` to the statement starting at `first`."""
    for name in BODIES:
        children = getattr(node, name, None)
        if not isinstance(children, list):
            continue
        for index, child in enumerate(children):
            start, end = start_line(child), getattr(child, "end_lineno", None) or 0
            if start == first and isinstance(child, ast.stmt):
                return [(name, index)]
            if start <= first <= end:
                rest = path_to(child, first)
                if rest is not None:
                    return [(name, index), *rest]
    return None


def aligned(old: list[ast.AST], new: list[ast.AST], index: int) -> int | None:
    """Return where statement `index` of `old` is in `new` (by signatures), or None."""
    matcher = difflib.SequenceMatcher(
        None, [signature(n) for n in old], [signature(n) for n in new]
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if i1 <= index < i2 and (tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1)):
            return j1 + index - i1
    return None


def candidate_span(plan: Plan, candidate: str) -> tuple[int, int] | None:
    """Return the lines of the rewritten statement that holds the site, or None.

    The statement is followed from the module down, each body aligned by its statements'
    kinds, names and assignment targets, so that inserted helpers and a rewrite spanning more
    lines do not shift it onto a neighbour.
    """
    old_tree, new_tree = parse(plan.request.original), parse(candidate)
    if old_tree is None or new_tree is None:
        return None
    steps = path_to(old_tree, plan.target.first)
    old: ast.AST = old_tree
    new: ast.AST = new_tree
    for name, index in steps or []:
        old_body, new_body = getattr(old, name), getattr(new, name, None)
        if not isinstance(new_body, list):
            return None
        where = aligned(old_body, new_body, index)
        if where is None:
            return None
        old, new = old_body[index], new_body[where]
    return statement_span(new) if steps else None


def rerun(
    command: str,
    plans: Sequence[Plan],
    texts: dict[str, str],
    ws: Workspace,
    config: VerifyConfig,
    side: str = "candidate",
) -> Rerun:
    """Run `command` on the rewritten copy (or `side`'s), recording the calls of each bound site."""
    spans: dict[str, list[list[Any]]] = defaultdict(list)
    unplaced = {}
    for plan in plans:
        span = candidate_span(plan, texts[plan.path])
        if span is None:
            unplaced[plan.id] = "the rewrite has no statement where the site was"
        else:
            spans[plan.path].append([*span, plan.id])
    folder = ws.base / f"records-{side}"
    folder.mkdir(exist_ok=True)
    plan_file = ws.base / f"record-plan-{side}.json"
    recorder_plan = RecordPlan(
        root=str(scratch(ws, side)),
        out=str(folder),
        max_calls=config.max_calls,
        spans=dict(spans),
        outputs=[p.id for p in plans],
        deep=sorted({p.path for p in plans if p.request.command}),  # notebooks' scripts
        helpers=helpers(plans),
    )
    plan_file.write_text(encode(recorder_plan), encoding="utf-8")
    error = run_command(command, ws, config, plan_file, side=side)
    refused: list[str] = []
    calls = collect(ws, config.max_calls, config.processes, folder, refused)
    for (
        plan
    ) in plans:  # read when a site's calls fall short: the verifier's doing, not the rewrite's
        if refused and plan.id not in unplaced:
            unplaced[plan.id] = f"{len(refused)} recorded call(s) refused: {refused[0]}"
    return Rerun(calls, error, unplaced, printed(ws, side, config.processes))


SHADOW = "~site"  # a shadow plan's id: its function plan's id, this, the site's index


def shadows(plans: Sequence[Plan]) -> list[Plan]:
    """Return, per site of each function target, a bound plan of the site's own statement.

    A recorded call of the function around a site may not replay outside the program: it ran
    inside a context the worker does not re-enter (a `tfds.testing.mock_data()` block, an open
    resource, a patched module). The callable created on the site's statement records its calls
    and outputs during the same command too, so such a site can still be verified as a bound
    site is: the command as the unit, run on both trees (`fallbacks`).
    """
    out = []
    for plan in plans:
        if plan.target.kind is not Kind.FUNCTION:
            continue
        tree = parse(plan.request.original)
        body = body_lines(tree, plan.target) if tree is not None else None
        if tree is None or body is None:
            continue
        for index, site in enumerate(plan.sites):
            chain = chain_at(tree, site.line)
            if not chain or not body[0] <= site.line <= body[1]:
                continue  # a definition changed by hand, or a site outside the function
            why = f"the call of `{plan.target.qualname}` could not be replayed"
            target = bound(chain, site.line, why)
            out.append(replace(plan, id=f"{plan.id}{SHADOW}{index}", sites=(site,), target=target))
    return out


def parent(shadow: Plan) -> str:
    return shadow.id.split(SHADOW)[0]


def fallbacks(
    candidates: Sequence[Plan], verdicts: dict[str, Verdict], recording: Recording
) -> list[Plan]:
    """Return the shadows to judge: their function's replay left it unverified, and the
    command recorded calls of their statement."""
    return [
        s
        for s in candidates
        if verdicts[parent(s)].status is Status.UNVERIFIED and s.id in recording.calls
    ]


def with_replay(verdict: Verdict, replay: Verdict) -> Verdict:
    """Return a shadow's verdict, saying why the replay of its function did not decide."""
    details = {**verdict.details, "replay": replay.reason}
    if verdict.status is not Status.UNVERIFIED:
        return replace(verdict, details=details)
    reason = f"{verdict.reason}; and replayed alone, its function's call: {replay.reason}"
    return replace(verdict, reason=reason, details=details)


def pairs(recorded: Recorded) -> list[list[str]]:
    """Return the [inputs, outputs] pickles of each recorded call."""
    return [[f, str(Path(f).with_suffix(".out.pkl"))] for f in recorded.files]


def edit_judged(plan: Plan, recording: Recording, command: str | None) -> str:
    """Return when what the command prints judges a group's edit outside a module-level
    function, and what kept it from judging this one (`verify.groups`)."""
    watch = method_watch(plan)
    if watch is None:
        return (
            "what the command prints judges a group's edits in a module-level function, or a "
            "method of a module-level class, only"
        )
    name = watch.qualname
    said = f"what the command prints judges them once a call of `{name}` ran them"
    missed = recording.missed.get(watch.id)
    if missed:
        return f"{said}: `{command}` called `{name}`, but its call(s) {missed}"
    if watch.id not in recording.ran:
        return f"{said}: `{command}` made no call of `{name}` seen to run them"
    return f"{said}, and the group's steps verified by their calls: not all did"


def judge_bound(
    plans: Sequence[Plan],
    recording: Recording,
    again: Rerun,
    worker: Worker,
    config: VerifyConfig,
) -> dict[str, Verdict]:
    """Return a verdict per bound plan from the two runs' recorded calls."""
    return {p.id: judge_one(p, recording, again, worker, config) for p in plans}


def judge_one(
    plan: Plan, recording: Recording, again: Rerun, worker: Worker, config: VerifyConfig
) -> Verdict:
    command = config.verify_with
    details: dict[str, Any] = {"target": plan.label, "unit": "verify-with", "reference": "original"}
    original = recording.calls.get(plan.id)
    if original is None:
        why = f"cannot be run alone: {plan.target.why}, and {no_call(command)}"
        if all(s.group_edit for s in plan.sites):
            why = (  # it makes nothing to call: a replication deleted, a readback, a conversion
                f"cannot be run alone: {plan.target.why}, and an edit of a program-level group "
                f"makes nothing whose calls `{command}` could record; "
                + edit_judged(plan, recording, command)
            )
        skip = skipped_by(plan)
        why += f": {skip}" if skip else ""
        return Verdict(Status.UNVERIFIED, why + tail(recording.error), details)
    details |= {"input_source": "recorded", "calls": len(original.files)}
    details["input_shapes"] = list(original.shapes)
    rewritten = again.calls.get(plan.id)
    made = len(rewritten.files) if rewritten else 0
    if made < len(original.files):
        why = (
            f"on the rewritten tree `{command}` made {made} recorded call(s) of the site, "
            f"the original {len(original.files)}"
        )
        if plan.id in again.unplaced:
            return Verdict(Status.UNVERIFIED, f"{why}: {again.unplaced[plan.id]}", details)
        if again.error and recording.error:  # a command failing on both trees is no reference
            if same_failure(recording.error, again.error):
                why = f"{fails_alike(command or '', again.error)}; {why}"
                return Verdict(Status.UNVERIFIED, why, details)
            why += f"; `{command}` failed on the original tree too{tail(recording.error)}"
            return Verdict(Status.UNVERIFIED, why + tail(again.error), details)
        if again.error:
            return Verdict(Status.FAILED, why + tail(again.error), details)
        return Verdict(Status.UNVERIFIED, why, details)
    assert rewritten is not None
    message = CompareRecords(original=pairs(original), candidate=pairs(rewritten))
    reply = worker.request(message, config.timeout)
    if reply.fault:
        return Verdict(Status.UNVERIFIED, f"the comparison {reply.fault}", details)
    return records_verdict(reply.message, details, command or "", again.error, recording.error)


SKIP_CALLS = {"pytest.skip"}  # and any `.skipTest(...)` (a TestCase's)
SKIP_DECORATORS = {"skip", "skipIf", "skipUnless", "skipif"}


def skipped_by(plan: Plan) -> str:
    """Return how the test holding the site skips itself before it (''; read from the source).

    A skipped test makes no call, so its sites cannot be compared: say so, rather than leave the
    user to find out why the command "made no call of it".
    """
    tree = parse(plan.request.original)
    line = min((s.line for s in plan.sites), default=0)
    if tree is None or not line:
        return ""
    holders = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    for holder in sorted(holders, key=lambda n: n.lineno):
        for decorator in holder.decorator_list:
            call = decorator.func if isinstance(decorator, ast.Call) else decorator
            if called_name(call) in SKIP_DECORATORS:
                conditional = called_name(call) != "skip"
                how = "may be skipped" if conditional else "is skipped"
                return f"`{holder.name}` {how} (`@{ast.unparse(call)}`, line {decorator.lineno})"
    functions = [h for h in holders if not isinstance(h, ast.ClassDef)]
    if not functions:
        return ""
    function = max(functions, key=lambda n: n.lineno)
    for node in ast.walk(function):
        if not isinstance(node, ast.Call) or node.lineno >= line:
            continue
        name = ast.unparse(node.func)
        if called_name(node.func) == "skipTest" or name in SKIP_CALLS:
            return f"`{function.name}` calls `{name}(...)` before it (line {node.lineno})"
    return ""


def called_name(node: ast.AST) -> str:
    """Return the last name of a called expression (`skipTest` of `self.skipTest`), or ''."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def records_verdict(
    data: protocol.Reply | None,
    details: dict[str, Any],
    command: str,
    error: str,
    before: str = "",
) -> Verdict:
    """Return the verdict from the comparison of the two runs' calls (`error`: how the command
    ended on the rewritten tree; `before`: on the original tree)."""
    if isinstance(data, Failed):
        return Verdict(Status.UNVERIFIED, f"the recorded calls: {data.error}", details)
    if not isinstance(data, RecordsCompared):
        kind = data.KIND if data is not None else None
        return Verdict(Status.UNVERIFIED, f"the recorded calls: a {kind} reply", details)
    if data.diverged:
        found = data.diverged
        why = (
            f"the runs diverged before the site: the inputs of call {(found.call or 0) + 1} "
            f"differ at {found.path} ({found.why})"
        )
        return Verdict(Status.UNVERIFIED, why, details)
    if not data.equal:
        from jaxmigrate.verify.judge import mismatch_verdict

        return mismatch_verdict(data.mismatch, details)
    errs = {
        "max_abs_err": data.max_abs_err,
        "max_rel_err": data.max_rel_err,
        "not_comparable": data.not_comparable,
    }
    details |= {k: v for k, v in errs.items() if v is not None}
    calls = details["calls"]
    if not data.has_values:
        why = f"the site's {calls} recorded call(s) return only functions or objects"
        return Verdict(Status.UNVERIFIED, why, details)
    if error and same_failure(before, error):
        why = f"{fails_alike(command, error)}; its {calls} recorded call(s) of the site agree"
        return Verdict(Status.UNVERIFIED, why, details)
    if error:
        why = f"its {calls} recorded call(s) agree, but on the rewritten tree {error}"
        return Verdict(Status.UNVERIFIED, why, details)
    why = f"`{command}` made the same {calls} call(s) of it on both trees, with agreeing outputs"
    return Verdict(Status.VERIFIED, why, details)


def tail(error: str) -> str:
    """Return how the command failed, as a suffix, or ''."""
    return f" ({error})" if error else ""


COPIES = re.compile(r"run-[a-z+-]+")  # each side's copy of the tree (`run-original/`)


def last_error(error: str) -> str:
    """Return the line that ended a command's output (its exception), copies' names dropped."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return COPIES.sub("run-*", lines[-1]) if len(lines) > 1 else ""


def same_failure(before: str, after: str) -> bool:
    """Return True if the command failed on both trees with the same exception."""
    return bool(before and after) and last_error(before) == last_error(after) != ""


def fails_alike(command: str, error: str) -> str:
    """Return that the command fails the same way on both trees: not the rewrite's doing."""
    return (
        f"`{command}` fails the same way before and after the rewrite ({last_error(error)}), "
        "so it shows nothing about the rewrite past that point"
    )
