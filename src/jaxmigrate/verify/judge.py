"""Turn the two workers' replies for one target into a verdict with a one-line reason.

The original side decides whether there is anything to compare against: if it cannot run (no
inputs, an exception under every reference, a crash, a hang) the site is `unverified`. Once it
ran, the rewrite must run and agree: an exception, a crash, a hang or a difference is `failed`,
except that a rewrite raising exactly what the original raised before a reference was used means
the inputs, not the rewrite, are at fault (`unverified`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jaxmigrate.model import Status
from jaxmigrate.verify.child.protocol import SCRIPT, Compared, Failed, Mismatch, Ran, Shows
from jaxmigrate.verify.config import Verdict
from jaxmigrate.verify.observed import observed_verdict
from jaxmigrate.verify.planner import Plan
from jaxmigrate.verify.pool import Reply

PROCESS_TAG = re.compile(r" \[process \d+ of \d+[^\]]*\]$")  # pool.tagged, multi-process jobs
KEPT = (
    "reference",
    "reference_errors",
    "missing_module",
    "calls",
    "input_shapes",
    "output_shapes",
    "contexts",
    "mapped_axis_size",
    "mesh_hint",
)


def test_folder(root: Path) -> str:
    """Return the project's test folder as a pytest argument (`test/`; `tests/` by default)."""
    for name in ("tests", "test", "testing"):
        if (root / name).is_dir():
            return f"{name}/"
    return "tests/"


def no_call(command: str | None) -> str:
    """Return what a reason says of a command that made no call of a site's target; a call that
    took another path replaces these words (`session.missed`)."""
    return f"`{command}` made no call of it"


def hint(plan: Plan, verify_with: str | None = None, tests: str = "tests/") -> str:
    """Return how to give the verifier inputs for this target, in one line.

    After `--verify-with`, the command is named (it made no call of the target) rather than
    suggested again.
    """
    name = plan.target.qualname
    declare = f'declare __jaxmigrate_examples__ = {{"{name}": [(x,)]}} in {plan.path}'
    if verify_with:
        return (
            f"no inputs for `{name}`: {no_call(verify_with)}; point --verify-with "
            f"at tests that call it, or {declare}"
        )
    command = f"pytest {tests}".strip()
    return (
        f'no inputs for `{name}`: pass --verify-with "{command}" (any command that calls it) '
        f"or {declare}"
    )


def reach_hint(plan: Plan, verify_with: str | None) -> str:
    """Return how to give a target calls that run its site."""
    name = plan.target.qualname
    where = f"`{verify_with}` did not" if verify_with else "none was recorded"
    return (
        f"a call that runs it is needed ({where}): point --verify-with at tests that call "
        f"`{name}` down that path, or declare such a call in __jaxmigrate_examples__"
    )


def base_details(plan: Plan, original: Ran) -> dict[str, Any]:
    details: dict[str, Any] = {"target": plan.label}
    if original.source:
        details["input_source"] = original.source
    kept = {k: getattr(original, k) for k in KEPT}
    details.update({k: v for k, v in kept.items() if v is not None})
    return details


def tried(reply: Reply) -> list[str]:
    """Return the errors of the references the original side tried before (or instead of)
    the one that ran: '<reference>: <error>' each."""
    message = reply.message
    if isinstance(message, Ran):
        return list(message.reference_errors or [])
    if isinstance(message, Failed):
        return [*(message.reference_errors or []), *(message.errors or [])]
    return []


def original_verdict(
    plan: Plan, reply: Reply, verify_with: str | None = None, tests: str = "tests/"
) -> Verdict | None:
    """Return the verdict when the original side gives nothing to compare with, else None."""
    details: dict[str, Any] = {"target": plan.label}
    if reply.fault:
        return Verdict(Status.UNVERIFIED, f"the original {reply.fault}", details)
    data = reply.message
    if isinstance(data, Ran):
        return nothing_shown(plan, data)
    if not isinstance(data, Failed):
        kind = data.KIND if data is not None else None
        return Verdict(Status.UNVERIFIED, f"the original's worker sent a {kind} reply", details)
    if data.nondeterministic:
        return Verdict(Status.UNVERIFIED, data.error, details)
    if data.no_inputs:
        return Verdict(Status.UNVERIFIED, hint(plan, verify_with, tests), details)
    if data.uncomparable:
        reason = f"the original runs, but what it returns cannot be compared: {data.error}"
        return Verdict(Status.UNVERIFIED, reason, details)
    if data.not_kept:
        return Verdict(Status.UNVERIFIED, data.error, details)
    if data.not_reached:
        reason = f"{data.error}: {reach_hint(plan, verify_with)}"
        return Verdict(Status.UNVERIFIED, reason, details)
    errors = data.errors if data.errors is not None else [data.error]
    details["reference_errors"] = errors
    if data.missing_module:
        details["missing_module"] = data.missing_module
    if data.stage == "inputs":
        reason = f"{hint(plan, verify_with, tests)} ({data.error})"
        return Verdict(Status.UNVERIFIED, reason, details)
    error = data.error
    if error.startswith(("FileNotFoundError", "NotADirectoryError")):
        reason = (
            f"the original cannot run the recorded call: {error}; the call needs files the "
            "recording did not leave (a temporary directory deleted after the command?): "
            "record with a command that keeps them, or declare __jaxmigrate_examples__"
        )
        return Verdict(Status.UNVERIFIED, reason, details)
    if data.stage == "target":
        reason = f"cannot be run alone: {data.error}: there is nothing to call"
        return Verdict(Status.UNVERIFIED, reason, details)
    return Verdict(Status.UNVERIFIED, f"the original cannot run: {data.error}", details)


def nothing_shown(plan: Plan, data: Ran) -> Verdict | None:
    """Return `unverified` when a unit ran but its run has nothing to compare, else None.

    A `main()` that returns nothing, prints nothing and writes no file agrees with anything.
    """
    found = data.shows
    if not found or found.returned or found.printed or found.files or found.steps:
        return None
    unit = unit_label(plan)
    reason = f"{unit} returned nothing and printed or wrote nothing to compare"
    if found.left_out:  # what it showed differs between two runs of the original
        reason = (
            f"the original is nondeterministic: {found.left_out}, and {unit} returned, "
            "printed or wrote nothing else to compare"
        )
    details = base_details(plan, data) | {"compared": found.details()}
    return Verdict(Status.UNVERIFIED, reason, details)


def unit_label(plan: Plan) -> str:
    """How a unit is named to the user: `main()`, `python train.py` for a script, the code
    cells of a notebook."""
    if plan.target.qualname == SCRIPT and plan.request.label:
        return f"`{plan.request.label}`'s code cells"
    if plan.target.qualname == SCRIPT:
        return f"`python {plan.path}`"
    return f"`{plan.target.qualname}()`"


def unit_runs(plan: Plan) -> str:
    """When a unit runs, in words: "`main()` runs", "its code cells run in order"."""
    if plan.target.qualname == SCRIPT and plan.request.label:
        return f"{unit_label(plan)} run in order"
    return f"{unit_label(plan)} runs"


def compared(found: Shows | None) -> str:
    """Return what a unit's comparison covered, in words ('' for a target that is no unit)."""
    if not found:
        return ""
    parts = ["its return value"] if found.returned else []
    if found.printed:
        parts.append(f"{found.printed} printed line(s)")
    files = found.files
    if files:
        names = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        parts.append(f"{len(files)} file(s) it wrote ({names})")
    if found.steps:
        parts.append(f"{found.steps} call(s) of its step in the flat layout")
    text = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    if found.left_out:
        text += f"; {found.left_out}"
    return text


def same_error(original: Ran, error: str) -> bool:
    """Return True if the rewrite raised what the original raised before a reference ran."""
    message = PROCESS_TAG.sub("", error).split(" (at ")[0]
    return any(
        e.split(": ", 1)[-1].split(" (at ")[0] == message for e in original.reference_errors or []
    )


def candidate_verdict(plan: Plan, original: Ran, reply: Reply) -> Verdict:
    """Return the verdict from the rewrite's run, given that the original ran."""
    details = base_details(plan, original)
    source = details.get("input_source", "")
    if reply.kind in ("start", "outputs", "protocol"):  # not the rewrite's doing
        return Verdict(Status.UNVERIFIED, f"the rewrite {reply.fault}", details)
    if reply.fault:
        return Verdict(Status.FAILED, f"the rewrite {reply.fault} (the original did not)", details)
    data = reply.message
    if isinstance(data, Compared) and data.candidate_contexts:
        details["candidate_contexts"] = data.candidate_contexts
    if isinstance(data, Failed) and data.stage in ("worker", "protocol"):  # the verifier's fault
        reason = f"the verifier could not run the rewrite: {data.error}"
        return Verdict(Status.UNVERIFIED, reason, details)
    if isinstance(data, Failed):
        return raised_verdict(original, data.error, data.stage, details)
    if not isinstance(data, Compared):
        kind = data.KIND if data is not None else None
        reason = f"the verifier could not run the rewrite: its worker sent a {kind} reply"
        return Verdict(Status.UNVERIFIED, reason, details)
    if not data.equal:
        verdict = mismatch_verdict(data.mismatch, details)
        if made_up_for_reference(original):
            return Verdict(Status.UNVERIFIED, made_up_reason(original, verdict.reason), details)
        return verdict
    details.update({"max_abs_err": data.max_abs_err, "max_rel_err": data.max_rel_err})
    if data.not_comparable:
        details["not_comparable"] = data.not_comparable
    unseen = observed_verdict(plan, original.observed, data.observed, details)
    if unseen is not None:  # compiles, lowering, shardings
        return unseen
    reference = original.reference
    against = "the original" if reference == "original" else f"the {reference} reference"
    if data.has_values is False:
        reason = (
            f"the outputs on {data.calls} {source} call(s) hold no values to compare with "
            f"{against}, only functions or objects: {data.not_comparable or 'by name'}"
        )
        return Verdict(Status.UNVERIFIED, reason, details)
    reason = f"agrees with {against} on {data.calls} {source} call(s)"
    if source == "run":  # a function without arguments (a `main()`): the program itself ran
        reason = f"agrees with {against} when {unit_runs(plan)}"
    if original.shows:
        details["compared"] = original.shows.details()
        reason += f" (compared: {compared(original.shows)})"
    if original.determinism:  # the original ran once: two runs would not fit the time
        details["determinism"] = original.determinism
        reason += f"; whether the original is deterministic was {original.determinism}"
    if data.returned_calls:
        details["returned_calls"] = data.returned_calls
        reason += f" and {data.returned_calls} call(s) of the function it returns"
    return Verdict(Status.VERIFIED, reason, details)


def raised_verdict(
    original: Ran, error: str, stage: str | None, details: dict[str, Any]
) -> Verdict:
    """Return the verdict when the rewrite raised on inputs the reference ran."""
    if same_error(original, error):
        reason = f"both the original and the rewrite raise on these inputs: {error}"
        return Verdict(Status.UNVERIFIED, reason, details)
    if stage == "call" and made_up_for_reference(original):
        return Verdict(Status.UNVERIFIED, made_up_reason(original, f"it raised: {error}"), details)
    kind = "does not import" if stage == "import" else "raised"
    return Verdict(Status.FAILED, f"the rewrite {kind}: {error}", details)


def made_up_for_reference(original: Ran) -> bool:
    """Return True if only a fallback reference ran synthesized inputs the original could not.

    Such inputs fit the reference (vmap has no device count) but maybe not the program: no
    candidate even traced through the original, so a rewrite that disagrees there shows
    nothing. (An original that traced and then raised, say a callback in a partial-auto
    region, is what the reference stands in for: disagreeing with it is a failure.)
    """
    stages = original.reference_stages or {}
    no_fit = any(stages.get(name) == "inputs" for name in ("original", "safe-rewrites"))
    return original.source == "synthesized" and no_fit


def made_up_reason(original: Ran, what: str) -> str:
    reference = original.reference
    return (
        f"the rewrite disagrees on synthesized inputs that the original itself could not run "
        f"(only the {reference} reference did); {what}; "
        "record real calls with --verify-with to decide"
    )


def mismatch_verdict(mismatch: Mismatch | None, details: dict[str, Any]) -> Verdict:
    """Return the failed verdict for outputs that differ: where, the shape, and by how much."""
    if mismatch is None:  # a reply saying the outputs differ without saying where
        return Verdict(Status.FAILED, "outputs differ (where was not sent)", details)
    details["mismatch"] = mismatch.details()
    errs = {"max_abs_err": mismatch.max_abs_err, "max_rel_err": mismatch.max_rel_err}
    details.update({k: v for k, v in errs.items() if v is not None})
    if mismatch.shown:  # what a unit printed or wrote (`child/shown.py`)
        reason = f"what the program shows differs at {mismatch.path}: {mismatch.why}"
        return Verdict(Status.FAILED, reason, details)
    shape = f" ({mismatch.dtype}{mismatch.shape})" if mismatch.shape is not None else ""
    where = f"{mismatch.path}{shape} of call {(mismatch.call or 0) + 1}"
    if mismatch.returned:
        where += " of the function the target returned"
    return Verdict(Status.FAILED, f"outputs differ at {where}: {mismatch.why}", details)


def layout_verdict(verdict: Verdict, original: Ran) -> Verdict:
    """Return `verdict` failed when the original broke what a program-level rewrite assumes.

    An argument the rewrite passes replicated (`P()`), or a result it reads whole, that differs
    between devices in the original makes the rewrite wrong on these inputs even where its
    outputs agree (on one process, a `P()` result keeps each device's own buffer): the site
    fails, and the faithful form, which assumes nothing of the kind, is tried instead.
    """
    found = original.layout_violations
    if not found or verdict.status not in (Status.VERIFIED, Status.FAILED):
        return verdict
    details = {**verdict.details, "layout_violations": list(found)}
    reason = str(found[0])
    if verdict.status is Status.FAILED:
        reason += f"; and {verdict.reason}"
    return Verdict(Status.FAILED, reason, details)


def uncalled_verdict(verdict: Verdict, plan: Plan, original: Ran) -> Verdict:
    """Return `verdict` unverified when the run never called a program-level step of the
    plan: its statement ran (the step was made), but nothing it computed was compared, so the
    run shows nothing about its rewrite (`p_eval` made in `main()`, called only `if
    evaluating:`). Its group is then not written."""
    lines = original.uncalled_steps
    if not lines or verdict.status is not Status.VERIFIED:
        return verdict
    where = ", ".join(str(line) for line in lines)
    unit = unit_label(plan)
    reason = (
        f"the run of {unit} never called the program-level step made on line(s) {where}, so it shows "
        f"nothing about that rewrite (it agreed on the rest: {verdict.reason})"
    )
    return Verdict(Status.UNVERIFIED, reason, {**verdict.details, "uncalled_steps": lines})


# Which JAX each side ran -----------------------------------------------------------------------
# What an original raises on a JAX that removed an API it uses (the worker's one-line errors).
REMOVED = (
    re.compile(r"No module named '(jax(?:lib)?\.[\w.]+)'"),
    re.compile(r"cannot import name '(\w+)' from '(jax[\w.]*)'"),
    re.compile(r"module '(jax[\w.]*)' has no attribute '(\w+)'"),
    re.compile(r"AttributeError: (jax\.[\w.]+) is deprecated"),
    re.compile(r"(jax\.[\w.]+) (?:was|has been) removed"),
    re.compile(r"(pjit)\(\) got an unexpected keyword argument '(\w+_axis_resources)'"),
)
# The newest JAX that still has an API (checked here by importing and calling it): what the
# hint suggests. APIs gone before 0.4.13 (`jax.experimental.PartitionSpec`,
# `jax.experimental.maps.Mesh`; `jax.experimental.maps` as a whole, whose xmap 0.4.30 still has)
# get no release: the user knows which JAX the code was written for.
LAST_WITH = (
    ("jax.experimental.host_callback", "0.4.30"),
    ("jax.device_put_replicated", "0.4.30"),
    ("jax.device_put_sharded", "0.4.30"),
    ("pjit(", "0.4.13"),  # in_axis_resources= / out_axis_resources=
)


def removed_api(errors: list[str]) -> str:
    """Return the JAX API the original's error says is gone (`jax.device_put_replicated`), or ''."""
    for error in errors:
        for pattern in REMOVED:
            found = pattern.search(error)
            if found is None:
                continue
            groups = found.groups()
            if len(groups) == 2 and pattern.pattern.startswith("cannot"):
                return f"{groups[1]}.{groups[0]}"
            if groups[0] == "pjit":
                return f"pjit(..., {groups[1]}=...)"
            return ".".join(groups)
    return ""


def last_with(api: str) -> str:
    """Return the newest JAX known to have `api`, or ''."""
    for prefix, version in LAST_WITH:
        if (
            api == prefix
            or api.startswith(prefix + ".")
            or prefix.endswith("(")
            and api.startswith(prefix)
        ):
            return version
    return ""


def with_jax(
    verdict: Verdict, tried: list[str], versions: dict[str, str], reference: bool
) -> Verdict:
    """Return `verdict` saying which JAX each side ran (`details["jax"]`; the reason too when
    they differ), and, when the original could not run here because its JAX API is gone (the
    errors of the references it `tried`), the flag that runs it on the JAX it was written for."""
    known = {side: v for side, v in versions.items() if v}
    details = {**verdict.details, "jax": known} if known else dict(verdict.details)
    reason = verdict.reason
    if len(set(known.values())) > 1:
        reason += (
            f" (the original on JAX {known.get('original', '?')}, "
            f"the rewrite on JAX {known.get('candidate', '?')})"
        )
    errors = [e.removeprefix("original: ") for e in tried if e.startswith("original: ")]
    gone = removed_api(errors)
    if gone and not reference:
        here = known.get("original") or known.get("candidate") or "installed"
        details["removed_api"] = gone
        release = last_with(gone)
        flag = (
            f"--reference-jax {release} (or the JAX it was written for)"
            if release
            else "--reference-jax with the JAX it was written for"
        )
        reason += (
            f"; the original itself cannot run on JAX {here}: `{gone}` is gone from it; "
            f"pass {flag} to verify against the original on its own JAX"
        )
    return Verdict(verdict.status, reason, details)
