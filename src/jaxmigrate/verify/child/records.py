"""The `compare-records` request: compare the calls a command recorded on both trees, inputs
first, then outputs, and reply `RecordsCompared` (or `Failed`).

Inputs that differ mean the runs diverged before the site (not the site's fault).
"""

from __future__ import annotations

from typing import Any

from .protocol import CompareRecords, Failed, Mismatch, RecordsCompared, Reply, record
from .runner import Runner, load_pickle


def handle(runner: Runner, request: CompareRecords, state: Any = None) -> Reply:
    """Compare the two runs' recorded calls, one by one; stop at the first difference."""
    from .compare import compare, has_values, max_errors
    from .hostify import flatten_output, from_host
    from .inputs import add_import_paths

    # what was pickled by name from a folder the command imported (the script's folder,
    # `examples/imagenet` when the tree is the repository) is found from there
    for orig, cand in zip(request.original, request.candidate):
        add_import_paths(orig[0])
        add_import_paths(cand[0])
    notes: list[str] = []
    worst = (0.0, 0.0)
    expected = []
    for i, (orig, cand) in enumerate(zip(request.original, request.candidate)):
        try:
            (orig_in, orig_out), (cand_in, cand_out) = (
                [load_pickle(path) for path in orig],
                [load_pickle(path) for path in cand],
            )
        except OSError:
            return Failed(stage="call", error=f"the output of call {i + 1} was not recorded")
        orig_flat, cand_flat = (
            flatten_output(from_host(orig_in)),
            flatten_output(from_host(cand_in)),
        )
        found = compare(orig_flat, cand_flat, inputs=True)
        if found is not None:
            return RecordsCompared(diverged=record(Mismatch, found | {"call": i}))
        found = compare(orig_out, cand_out, notes)
        if found is not None:
            return RecordsCompared(equal=False, mismatch=record(Mismatch, found | {"call": i}))
        errs = max_errors(orig_out, cand_out)
        worst = (max(worst[0], errs[0]), max(worst[1], errs[1]))
        expected.append(orig_out)
    return RecordsCompared(
        equal=True,
        max_abs_err=worst[0],
        max_rel_err=worst[1],
        not_comparable=list(dict.fromkeys(notes))[:5],
        has_values=any(has_values(r) for r in expected),
    )
