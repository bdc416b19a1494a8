"""Turn the two workers' replies for one target into a verdict with a one-line reason.

The original side decides whether there is anything to compare against: if it cannot run (no
inputs, an exception under every reference, a crash, a hang) the site is `unverified`. Once it
ran, the rewrite must run and agree: an exception, a crash, a hang or a difference is `failed`,
except that a rewrite raising exactly what the original raised before a reference was used means
the inputs, not the rewrite, are at fault (`unverified`).
"""

from __future__ import annotations

import re
from typing import Any

from jaxmigrate.model import Status
from jaxmigrate.verify.config import Verdict
from jaxmigrate.verify.planner import Plan
from jaxmigrate.verify.pool import Reply

PROCESS_TAG = re.compile(r" \[process \d+ of \d+[^\]]*\]$")  # pool.tagged, multi-process jobs
KEPT = (
    "reference",
    "reference_errors",
    "calls",
    "input_shapes",
    "output_shapes",
    "contexts",
    "mapped_axis_size",
    "mesh_hint",
)


def hint(plan: Plan) -> str:
    """Return how to give the verifier inputs for this target, in one line."""
    name = plan.target.qualname
    return (
        f'no inputs for `{name}`: pass --verify-with "pytest tests/" (any command that calls it) '
        f'or declare __jaxmigrate_examples__ = {{"{name}": [(x,)]}} in {plan.path}'
    )


def base_details(plan: Plan, original: dict[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = {"target": plan.label}
    if original.get("source"):
        details["input_source"] = original["source"]
    details.update({k: original[k] for k in KEPT if k in original})
    return details


def original_verdict(plan: Plan, reply: Reply) -> Verdict | None:
    """Return the verdict when the original side gives nothing to compare with, else None."""
    details = {"target": plan.label}
    if reply.fault:
        return Verdict(Status.UNVERIFIED, f"the original {reply.fault}", details)
    data = reply.data
    if data.get("ok"):
        return None
    if data.get("no_inputs"):
        return Verdict(Status.UNVERIFIED, hint(plan), details)
    errors = data.get("errors", [data.get("error", "")])
    details["reference_errors"] = errors
    if data.get("stage") == "inputs":
        return Verdict(Status.UNVERIFIED, f"{hint(plan)} ({data.get('error')})", details)
    return Verdict(Status.UNVERIFIED, f"the original cannot run: {data.get('error')}", details)


def same_error(original: dict[str, Any], error: str) -> bool:
    """Return True if the rewrite raised what the original raised before a reference ran."""
    message = PROCESS_TAG.sub("", error).split(" (at ")[0]
    return any(
        e.split(": ", 1)[-1].split(" (at ")[0] == message
        for e in original.get("reference_errors", [])
    )


def candidate_verdict(plan: Plan, original: dict[str, Any], reply: Reply) -> Verdict:
    """Return the verdict from the rewrite's run, given that the original ran."""
    details = base_details(plan, original)
    source = details.get("input_source", "")
    if reply.kind == "start":
        return Verdict(Status.UNVERIFIED, f"the rewrite {reply.fault}", details)
    if reply.fault:
        return Verdict(Status.FAILED, f"the rewrite {reply.fault} (the original did not)", details)
    data = reply.data
    if data.get("candidate_contexts"):
        details["candidate_contexts"] = data["candidate_contexts"]
    if not data.get("ok"):
        error = str(data.get("error", ""))
        if same_error(original, error):
            reason = f"both the original and the rewrite raise on these inputs: {error}"
            return Verdict(Status.UNVERIFIED, reason, details)
        stage = "does not import" if data.get("stage") == "import" else "raised"
        return Verdict(Status.FAILED, f"the rewrite {stage}: {error}", details)
    if not data.get("equal"):
        mismatch = data["mismatch"]
        details["mismatch"] = mismatch
        details.update({k: mismatch[k] for k in ("max_abs_err", "max_rel_err") if k in mismatch})
        where = f"{mismatch['path']} of call {mismatch['call'] + 1}"
        return Verdict(Status.FAILED, f"outputs differ at {where}: {mismatch['why']}", details)
    details.update({"max_abs_err": data["max_abs_err"], "max_rel_err": data["max_rel_err"]})
    reference = original.get("reference", "original")
    against = "the original" if reference == "original" else f"the {reference} reference"
    reason = f"agrees with {against} on {data['calls']} {source} call(s)"
    return Verdict(Status.VERIFIED, reason, details)
