"""The `run-candidate` request: run the rewrite on the inputs the original side wrote, compare
its outputs with the original's, and reply `Compared` (or `Failed`).

A factory's returned function is then run on the calls recorded for the original's.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .protocol import Compared, Failed, Mismatch, Reply, Run, RunCandidate, record
from .protocol import Observed as Seen
from .runner import RETURNED, SHOWN, STEPS, Runner, UserError, load_pickle, returned_request


def handle(runner: Runner, request: RunCandidate, state: Any = None) -> Reply:
    """Run the rewrite on the original's inputs and compare with the original's outputs."""
    from .compare import has_values
    from .inputs import add_import_paths
    from .layouts import flat_in
    from .observe import Observed

    for path in request.records:
        add_import_paths(path)
    try:
        calls, expected = load_io(request, "")
        returned, returned_expected = load_io(request, RETURNED)
        runner.observed = observed = Observed()
        # imported under the capture: a step made at module level is made at import
        with steps_captured(runner, request):
            _, fn = runner.target(request, "candidate")
            first = compare_calls(runner, fn, calls, expected, request, "")
            if not first.equal or not returned:
                reply = first
            else:
                sub = returned_request(request)
                last = flat_in(runner.last_output)  # a program-level step: the flat layout
                reply = compare_calls(runner, last, returned, returned_expected, sub, "r")
    except UserError as exc:
        return Failed(stage=exc.stage, error=str(exc))
    finally:
        runner.observed = None
    if not reply.equal:
        return reply
    notes = (first.not_comparable or []) + ((reply.not_comparable or []) if returned else [])
    return dataclasses.replace(
        reply,
        calls=len(calls),
        returned_calls=len(returned),
        max_abs_err=max(first.max_abs_err or 0.0, reply.max_abs_err or 0.0),
        max_rel_err=max(first.max_rel_err or 0.0, reply.max_rel_err or 0.0),
        not_comparable=list(dict.fromkeys(notes))[:5],
        has_values=any(has_values(r) for r in [*expected, *returned_expected]),
        observed=record(Seen, observed.summary()),
    )


@contextmanager
def steps_captured(runner: Runner, request: RunCandidate) -> Iterator[None]:
    """Keep the rewrite's step calls in each call when the original kept its own."""
    from .layouts import capturing

    if not os.path.exists(request.outputs_path + STEPS) or not request.layouts:
        yield
        return
    runner.steps = []
    runner.patched += 1  # the module is imported again, under this request's capture
    path = os.path.join(runner.root, request.target.file)
    try:
        with capturing(request.layouts, path, runner.steps):
            yield
    finally:
        runner.steps = None


def load_io(request: Run, suffix: str) -> tuple[list[Any], list[Any]]:
    """Return the inputs and outputs the original side wrote (none if it wrote none)."""
    loaded = []
    for path in (request.inputs_path, request.outputs_path):
        try:
            with open(path + suffix, "rb") as handle:
                loaded.append(pickle.load(handle))
        except FileNotFoundError:
            loaded.append([])
    return loaded[0], loaded[1]


def compare_calls(
    runner: Runner, fn: Any, calls: list[Any], expected: list[Any], request: Run, kind: str
) -> Compared:
    """Run `fn` on each call and compare with `expected`; stop at the first difference."""
    from .compare import compare, max_errors
    from .layouts import one_copy
    from .shown import shown_mismatch

    notes: list[str] = []
    worst = (0.0, 0.0)
    contexts: list[str] = []
    shown = load_pickle(request.outputs_path + SHOWN, []) if not kind else []
    runner.shown = []
    for i, (call, ref) in enumerate(zip(calls, expected)):
        flat, contexts = runner.call(fn, call, request, "candidate")
        ref = ref if kind else one_copy(request.layouts, ref, flat)
        mismatch = compare(ref, flat, notes)
        if mismatch is None and i < len(shown) and runner.shown:
            mismatch = shown_mismatch(shown[i], runner.shown[-1])
        if mismatch is not None:
            where = {"call": i} | ({"returned": True} if kind else {})
            found = record(Mismatch, mismatch | where)
            return Compared(equal=False, mismatch=found, candidate_contexts=contexts)
        errs = max_errors(ref, flat)
        worst = (max(worst[0], errs[0]), max(worst[1], errs[1]))
    return Compared(
        equal=True,
        max_abs_err=worst[0],
        max_rel_err=worst[1],
        candidate_contexts=contexts,
        not_comparable=notes,
    )
