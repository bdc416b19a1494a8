"""The other sites of a program-level group in a function that cannot be replayed: judged by
what the `--verify-with` command prints.

flax's lm1b `train_and_evaluate` runs inside `tfds.testing.mock_data()`; replayed alone in a
worker it reads the real, empty dataset, so its sites are left to the command (`bound.shadows`).
The group's steps are compared there by their calls, in the flat layout. Its other sites (a
replication deleted, a batch split made a sharded array, a readback gone) create no callable
whose calls could be recorded, so they stayed `unverified`, and the group, written only whole,
was never written.

Such a site is judged as a unit (a `main()`) is, on what the program shows, with the command as
the program:

- a call of the function ran it: the recorder's line watch saw a call run every site of the
  function (`Recording.ran`), also a call it could not record (lm1b's `evaluate(p_eval_step=...)`
  takes a pmapped function, which does not pickle);
- every step of its group verified by its calls: the runs did not diverge before the steps;
- the command printed the same lines on both trees, each process its own (`shown`: words exactly,
  numbers within a tolerance, durations not compared), less the lines that differ between two
  runs of the original (one more run of the command, only when such a site exists), and at
  least one line was compared that the original printed once that call had begun: a banner
  printed before it shows nothing of what the call computed. Where the call began is known
  when the command's Python process prints straight to the file jaxmigrate gave it
  (`recorder.stdout_offset`); else (a pipe, a test runner's capture) every line counts.

A difference in what the command prints is the group's failure (its steps then take the
faithful form, PL603); a command that fails on the rewritten tree alone too. Printing the same
with nothing compared, or a command failing on the original, leaves the site `unverified`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxmigrate.model import Status
from jaxmigrate.verify.bound import Rerun, parent, tail
from jaxmigrate.verify.child.shown import Shown, left_out, shown_mismatch, varying
from jaxmigrate.verify.config import Verdict
from jaxmigrate.verify.planner import Plan
from jaxmigrate.verify.recording import PRINTED_LIMIT, Printed, Recording, method_watch


def steps_verified(plans: Sequence[Plan], verdicts: Mapping[str, Verdict]) -> set[tuple[str, str]]:
    """Return the program-level groups, (file, group), whose every step is verified so far.

    A step's site may be judged by several plans (the function around it, unverified when its
    call could not be replayed, and the shadow of its statement): as `session.combined` joins
    them, failed if any failed, else verified if any verified. A group is a file's (its id is
    the step's position there).
    """
    statuses: dict[tuple[str, str], set[Status]] = {}
    groups: dict[tuple[str, str], tuple[str, str]] = {}
    for plan in plans:
        for site in plan.sites:
            if site.group_step and plan.id in verdicts:
                statuses.setdefault((plan.path, site.key), set()).add(verdicts[plan.id].status)
                groups[(plan.path, site.key)] = (plan.path, site.group or "")
    verified = {g: True for g in groups.values()}
    for key, found in statuses.items():
        if Status.FAILED in found or Status.VERIFIED not in found:
            verified[groups[key]] = False
    return {g for g, ok in verified.items() if ok}


@dataclass(frozen=True)
class Edit:
    """A group's edit to judge by what the command prints, and the call that ran it."""

    plan: Plan  # a shadow of a function's site, or a bound plan in a method
    ran: str  # the recorder's target whose call ran it (`Recording.ran`)
    function: str  # that target's name, for the reason: `train`, `Evaluator.run`


def pending(
    candidates: Sequence[Plan],
    plans: Sequence[Plan],
    verdicts: Mapping[str, Verdict],
    recording: Recording,
    functions: Mapping[str, Plan],
) -> list[Edit]:
    """Return the edits the command's output judges (see the module's doc): sites of a
    program-level group whose group's steps all verified (`plans`: every plan judged so far),
    each either a shadow of a site in a function left unverified (`functions`, by id), or a
    bound plan in a method (`recording.method_watch`), a call of which ran them."""
    groups = steps_verified(plans, verdicts)
    out = []
    for plan in candidates:
        site = plan.sites[0]
        if (plan.path, site.group or "") not in groups or not site.group_edit:
            continue
        watch = method_watch(plan)
        judged = verdicts.get(plan.id)
        if watch is not None and watch.id in recording.ran:
            if judged is not None and judged.status is not Status.UNVERIFIED:
                continue
            out.append(Edit(plan, watch.id, watch.qualname))
            continue
        function = functions.get(parent(plan))
        if function is None or plan.id in verdicts or function.id not in recording.ran:
            continue
        if verdicts[function.id].status is Status.UNVERIFIED:
            out.append(Edit(plan, function.id, function.target.qualname))
    return out


def judge(
    edits: Sequence[Edit],
    command: str,
    recording: Recording,
    again: tuple[Printed, str],
    rewritten: Rerun,
) -> dict[str, Verdict]:
    """Return a verdict per pending edit from the command's printed output: the original's
    run (`recording`), its second run (`again`: printed, how it ended), the rewritten tree's."""
    status, why, details, kept = printed_verdict(command, recording, again, rewritten)
    out = {}
    for edit in edits:
        plan, function = edit.plan, edit.function
        where = f"a call of `{function}` ran its line {plan.sites[0].line}"
        steps = "its group's steps made the same calls in the flat layout"
        verdict = Verdict(status, f"{why}; {where}, and {steps}", {"target": plan.label, **details})
        if status is not Status.VERIFIED:
            verdict = Verdict(status, why, verdict.details)
        elif not shown_after(kept, recording.ran[edit.ran]):
            late = (
                f"`{command}` prints the same on both trees, but each line compared was printed"
                f" before the call of `{function}` that ran line {plan.sites[0].line} began:"
                " none shows what that call computed"
            )
            verdict = Verdict(Status.UNVERIFIED, late, verdict.details)
        out[plan.id] = verdict
    return out


def by_file(
    edits: Sequence[Edit],
    command: str,
    recording: Recording,
    again: tuple[Printed, str],
    rerun_alone: Callable[[str, dict[str, str]], Rerun],
) -> dict[str, Verdict]:
    """Return the edits' verdicts judged again file by file, each on a run of the command
    where that file alone is rewritten (`rerun_alone(side, texts)`): when the tree with every
    site rewritten printed something else and the edits span several files, a wrong rewrite in
    one file fails its own groups, not another's. Each file's rewrite holds alone (a boundary
    it shares with a file not rewritten is converted: `device_copies`, `from_device_copies`).

    What is written together is judged together: the files that pass alone are run once more,
    rewritten together, when there are several, and keep the first run's failure unless that
    run prints the same too (rewrites right alone and wrong together: neither is verified).
    """
    paths = sorted({edit.plan.path for edit in edits})
    if len(paths) < 2:
        return {}
    texts = {path: written(edits, [path]) for path in paths}
    alone = {
        path: judge(
            [e for e in edits if e.plan.path == path],
            command,
            recording,
            again,
            rerun_alone(f"alone-{index}", texts[path]),
        )
        for index, path in enumerate(paths)
    }
    right = [p for p in paths if all(v.status is Status.VERIFIED for v in alone[p].values())]
    if len(right) == len(paths):
        return {}  # each right alone, wrong together: the first run's failure stands
    kept = right
    if len(right) > 1:  # written together, so judged together too
        run = rerun_alone("alone-together", written(edits, right))
        together = judge([e for e in edits if e.plan.path in right], command, recording, again, run)
        kept = right if all(v.status is Status.VERIFIED for v in together.values()) else []
    out = {}
    for path, verdicts in alone.items():
        if path in right and path not in kept:
            continue  # right alone, not together with the others right alone: as it was
        others = [p for p in kept if p != path] if path in kept else []
        how = f"{path} alone" if not others else f"{path} alone, and with {', '.join(others)},"
        for key, verdict in verdicts.items():
            said = (
                f"{verdict.reason} (judged on a run with {how} rewritten: with every site "
                "rewritten the command printed something else)"
            )
            out[key] = Verdict(verdict.status, said, {**verdict.details, "alone": path})
    return out


def written(edits: Sequence[Edit], paths: Sequence[str]) -> dict[str, str]:
    """Return the texts of the files `paths` rewritten, with the helpers their rewrites write."""
    out: dict[str, str] = {}
    for edit in edits:
        request = edit.plan.request
        if request.path in paths:
            out.update({**request.files, request.path: request.candidate})
    return out


def shown_after(kept: Sequence[Sequence[int]], began: Sequence[int | None]) -> bool:
    """Return True if a process printed a compared line (`kept`, its indices per process) once
    the call began (`began`: the lines each process printed before it; None: not known, and
    every line counts)."""
    return any(
        any(i >= (start or 0) for i in lines) for lines, start in zip(kept, began, strict=True)
    )


def printed_verdict(
    command: str,
    recording: Recording,
    again: tuple[Printed, str],
    rewritten: Rerun,
) -> tuple[Status, str, dict[str, Any], list[list[int]]]:
    """Return the status, reason and details of the command's printed output on both trees,
    and the indices of the lines compared, per process."""
    details: dict[str, Any] = {"unit": "verify-with", "reference": "original"}
    printed_again, error_again = again
    if recording.error or error_again:
        why = f"`{command}` failed on the original tree: it shows nothing to compare against"
        return Status.UNVERIFIED, why + tail(recording.error or error_again), details, []
    if rewritten.error:
        why = f"`{command}` runs on the original tree, but on the rewritten tree {rewritten.error}"
        return Status.FAILED, why, details, []
    compared = 0
    kept: list[list[int]] = []
    skipped = []
    count = len(recording.printed)
    for i, (first, second, new) in enumerate(
        zip(recording.printed, printed_again, rewritten.printed, strict=True)
    ):
        where = f" (process {i} of {count})" if count > 1 else ""
        if first is None or second is None or new is None:
            why = f"`{command}` printed more than {PRINTED_LIMIT >> 20} MiB{where}: not compared"
            return Status.UNVERIFIED, why, details, []
        reference = varying(Shown(list(first)), Shown(list(second)))
        found = shown_mismatch(reference, Shown(list(new)))
        if found is not None:
            details["mismatch"] = {**found, "process": i}
            why = f"what `{command}` prints differs on the rewritten tree{where}: {found['path']} is {found['why']}"
            return Status.FAILED, why, details, []
        compared += reference.compared()[0]
        kept.append(compared_lines(reference))
        if left_out(reference):
            skipped.append(left_out(reference) + where)
    details["printed"] = {"compared": compared, "left_out": skipped}
    if not compared:
        why = f"`{command}` printed no line two runs of the original agree on"
        return Status.UNVERIFIED, why + (f" ({'; '.join(skipped)})" if skipped else ""), details, []
    why = f"`{command}` prints the same on both trees (compared: {compared} printed line(s)"
    why += f"; {'; '.join(skipped)})" if skipped else ")"
    return Status.VERIFIED, why, details, kept


def compared_lines(reference: Shown) -> list[int]:
    """Return the indices of the printed lines `reference` compares (two runs agree on them)."""
    if reference.printed_varies:
        return []
    varies = set(reference.varying_lines)
    return [i for i in range(len(reference.printed)) if i not in varies]
