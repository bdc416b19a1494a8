"""The `run-original` request: run the original (or its first reference that runs) on its
inputs, write its inputs and outputs for the candidate side, and reply `Ran` (or `Failed`).

A unit (a call without arguments: the program) is run twice, each time from the state the
program starts in: if the runs disagree, or only one raises, the original is nondeterministic
and nothing can be compared with it; what it prints or writes differently in the two runs is
left out of the comparison.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from .protocol import Failed, Ran, Reply, RunOriginal, Shows, record
from .protocol import Observed as Seen
from .runner import (
    RETURNED,
    SHOWN,
    STEPS,
    NoInputs,
    NotReached,
    Runner,
    Uncomparable,
    Unkept,
    UserError,
    load_pickle,
    returned_request,
)

STAGES = ("import", "target", "inputs", "call")
AGAIN = ".again"  # the inputs and outputs of the original's second run of a unit
SECOND_RUN_SHARE = 0.4  # a unit's original runs twice if its first run took under this share


def handle(runner: Runner, request: RunOriginal, state: Any = None) -> Reply:
    """Run the original (or its first reference that runs); write inputs and outputs.

    The second run of a unit starts from `state`, laid back in between.
    """
    from .references import ORIGINAL

    runner.unit_variants = []
    started = time.monotonic()
    first = run_references(runner, request)
    if ORIGINAL not in runner.unit_variants or state is None:
        return first
    took = time.monotonic() - started
    budget = request.timeout
    if budget and took > SECOND_RUN_SHARE * budget:  # a second run would not fit
        why = f"not checked: one run took {took:.0f} s of the {budget:g} s allowed"
        return dataclasses.replace(first, determinism=why) if isinstance(first, Ran) else first
    runner.lay_back(state)
    again = dataclasses.replace(
        request,
        references=[ORIGINAL],
        inputs_path=request.inputs_path + AGAIN,
        outputs_path=request.outputs_path + AGAIN,
    )
    second = run_references(runner, again)
    return against_second(request, first, second)


def nondeterministic(why: str) -> Failed:
    """Return the reply of an original that disagrees with itself."""
    error = f"the original is nondeterministic: {why}"
    return Failed(stage="call", error=error, nondeterministic=True)


def shows(shown: list[Any], returned: bool, steps: int = 0) -> Shows:
    """Return what a unit's comparison covers: its return value, printed lines, files, and
    the calls of its program-level step."""
    lines = 0
    files: list[str] = []
    for one in shown:
        count, names = one.compared()
        lines += count
        files += [n for n in names if n not in files]
    return Shows(returned=returned, printed=lines, files=files, steps=steps)


STEP_CALLS = "['step calls (flat layout)']"  # where `Runner.with_steps` puts them


def returns_and_steps(flats: list[Any]) -> tuple[bool, int]:
    """Whether a unit's outputs hold a value it returned, and how many step calls they hold."""
    from .values import Opaque

    paths = [path for flat in flats for path, leaf in flat.leaves if not isinstance(leaf, Opaque)]
    steps = {path[len(STEP_CALLS) :].split("]")[0] for path in paths if path.startswith(STEP_CALLS)}
    return any(not path.startswith(STEP_CALLS) for path in paths), len(steps)


def against_second(request: RunOriginal, first: Reply, second: Reply) -> Reply:
    """Return the first run's reply, or why the original disagrees with itself."""
    from .compare import compare
    from .references import ORIGINAL
    from .shown import left_out, varying

    first_ok = isinstance(first, Ran) and first.reference == ORIGINAL
    if first_ok != isinstance(second, Ran):
        failed = second if first_ok else first
        errors = failed_errors(failed)
        error = next(
            (e.split(": ", 1)[1] for e in errors if e.startswith(f"{ORIGINAL}: ")),
            failed.error if isinstance(failed, Failed) else "",
        )
        return nondeterministic(f"it raised in one of two runs and not in the other ({error})")
    if not first_ok or not isinstance(first, Ran):
        return first
    paths = (request.outputs_path, request.outputs_path + AGAIN)
    outputs = [load_pickle(path) for path in paths]
    for i, (a, b) in enumerate(zip(*outputs)):
        found = compare(a, b)
        if found is not None:
            return nondeterministic(
                f"two runs disagree at {found['path']} of call {i + 1} ({found['why']})"
            )
    shown_path = request.outputs_path + SHOWN
    if not os.path.exists(shown_path):
        return first
    runs = [load_pickle(path + SHOWN) for path in paths]
    kept = [varying(a, b) for a, b in zip(*runs)]
    with open(shown_path, "wb") as handle:
        pickle.dump(kept, handle)
    found_shows = shows(
        kept, bool(first.shows and first.shows.returned), first.shows.steps if first.shows else 0
    )
    note = left_out(kept[0]) if kept else ""
    if note:
        found_shows = dataclasses.replace(found_shows, left_out=note)
    return dataclasses.replace(first, shows=found_shows)


def failed_errors(reply: Reply) -> list[str]:
    """Return the errors of the references a reply tried (none if it has none)."""
    if isinstance(reply, Failed):
        return reply.reference_errors or reply.errors or []
    if isinstance(reply, Ran):
        return reply.reference_errors or []
    return []


def run_references(runner: Runner, request: RunOriginal) -> Reply:
    """Run the original (or its first reference that runs); write inputs and outputs."""
    from .references import ORIGINAL, reference

    errors: list[str] = []
    stages: dict[str, str] = {}
    furthest: UserError | None = None
    missing: str | None = None  # the module whose absence kept the original itself from running
    for name in request.references:
        called: set[int] = set()
        with reference(name), layouts_checked(runner, request, name, called) as violations:
            try:
                reply = attempt(runner, request, name)
                if violations:
                    reply = dataclasses.replace(reply, layout_violations=violations)
                uncalled = sorted({lay["line"] for lay in request.layouts} - called)
                if uncalled and name == ORIGINAL and isinstance(reply, Ran):
                    reply = dataclasses.replace(reply, uncalled_steps=uncalled)
            except NoInputs as exc:
                return Failed(stage=exc.stage, error=str(exc), no_inputs=True)
            except NotReached as exc:  # another reference takes the same path
                return Failed(stage=exc.stage, error=str(exc), not_reached=True)
            except Uncomparable as exc:  # it ran: another reference returns the same
                return Failed(stage=exc.stage, error=str(exc), uncomparable=True)
            except Unkept as exc:  # no reference can start from the files as they were
                return Failed(stage=exc.stage, error=str(exc), not_kept=True)
            except UserError as exc:
                errors.append(f"{name}: {exc}")
                stages[name] = exc.stage
                missing = exc.missing if name == ORIGINAL else missing
                if furthest is None or STAGES.index(exc.stage) > STAGES.index(furthest.stage):
                    furthest = exc
                continue
        if errors:
            reply = dataclasses.replace(
                reply, reference_errors=errors, reference_stages=stages, missing_module=missing
            )
        return reply
    stage, error = (furthest.stage, str(furthest)) if furthest else ("inputs", "no reference")
    return Failed(stage=stage, error=error, errors=errors, missing_module=missing)


@contextmanager
def layouts_checked(
    runner: Runner, request: RunOriginal, variant: str, called: set[int]
) -> Iterator[list[str]]:
    """Check the original's pmapped steps against what program-level rewrites assume of
    them (`child.layouts`); yield where they do not hold (nothing to check: no list). The
    `line` of each step the run called is added to `called`."""
    import jax

    from .layouts import checking
    from .references import ORIGINAL

    # The marker of a reference tried before goes first: the original's attempt writes it
    # even when its run raised (the error is its reply), and a fallback reference (the safe
    # rewrites, the vmap oracle) records no step calls: the rewrite's side must not either.
    marker = request.outputs_path + STEPS
    if os.path.exists(marker):
        os.remove(marker)
    if variant != ORIGINAL or not request.layouts:
        yield []
        return
    path = os.path.join(runner.root, request.target.file)
    layouts = request.layouts
    runner.patched += 1  # the module is imported again, under this request's checks
    # The step calls are compared when the rewrite's step was found, in one process (a
    # global array is not readable whole from one process).
    compared = jax.process_count() == 1 and all("candidate_line" in lay for lay in layouts)
    runner.steps = [] if compared else None
    try:
        with checking(layouts, path, runner.steps, called) as found:
            yield found
            if compared:  # the outputs hold the step calls: the rewrite's side too
                with open(marker, "w", encoding="utf-8") as handle:
                    handle.write("flat layout\n")
    finally:
        runner.steps = None


def watcher(request: RunOriginal, module: ModuleType, variant: str) -> Any:
    """Return a Watch over the sites' lines for a function target's calls, else None.

    A callable target (`step = jax.pmap(f)`) is its site: calling it runs the rewrite. A
    module with the safe rewrites applied may have other line numbers: not watched.
    """
    from .reach import Watch, spans_of
    from .references import SAFE_REWRITES

    filename = getattr(module, "__file__", None)
    if not request.reach or variant.startswith(SAFE_REWRITES) or not filename:
        return None
    return Watch(filename, spans_of(request.reach))


def not_reached(request: RunOriginal, source: str, calls: int, missing: Any) -> str:
    """Return why a target's calls verify nothing: they never ran (some of) its sites."""
    from .reach import describe

    name = request.target.qualname
    return (
        f"the {calls} {source} call(s) of `{name}` {describe(missing)} "
        "(they took another path through it), so they show nothing about the rewrite"
    )


def attempt(runner: Runner, request: RunOriginal, variant: str) -> Ran:
    """Run one variant (the original, or a reference) on the inputs; write what it did."""
    from .hostify import flat_shapes, shapes
    from .observe import Observed
    from .pickling import dumps

    module, fn = runner.target(request, variant)
    runner.watch = watcher(request, module, variant)
    runner.shown = []
    if runner.watch is not None:  # every trace the calls use is made, and seen, below
        import jax

        jax.clear_caches()
    runner.observed = observed = Observed()
    try:
        calls, source, outputs, notes = inputs_and_outputs(runner, request, module, fn, variant)
        returned, returned_outputs = factory_calls(runner, request, variant)
    finally:
        watch, runner.watch, runner.observed = runner.watch, None, None
    if watch is not None and watch.missing:
        raise NotReached(not_reached(request, source, len(calls), watch.missing))
    for path, value in (
        (request.inputs_path, calls),
        (request.outputs_path, outputs),
        (request.inputs_path + RETURNED, returned),
        (request.outputs_path + RETURNED, returned_outputs),
    ):
        with open(path, "wb") as handle:
            handle.write(dumps(value))
    found_shows = None
    if runner.shown:  # a unit ran: what it printed and wrote is compared too
        with open(request.outputs_path + SHOWN, "wb") as handle:
            pickle.dump(runner.shown, handle)
        has_return, steps = returns_and_steps([*outputs, *returned_outputs])
        found_shows = shows(runner.shown, has_return, steps)
    size, hint = mesh_size(calls[0], request.inputs.structure)
    return Ran(
        reference=variant,
        source=source,
        calls=len(calls),
        returned_calls=len(returned),
        input_shapes=shapes(calls[0]),
        output_shapes=flat_shapes(outputs[0]),
        contexts=notes,
        observed=record(Seen, observed.summary()),
        shows=found_shows,
        mapped_axis_size=size,
        mesh_hint=hint,
    )


def mesh_size(call: Any, structure: dict[str, Any]) -> tuple[int | None, str | None]:
    """Return how many devices the pmap calls map, with a hint when not all of them."""
    import jax

    from .inputs import mapped_size

    size = mapped_size(call, structure)
    if size is None:
        return None, None
    local = jax.local_device_count()  # a pmap maps its process's devices
    if size == local:
        return size, None
    return size, f"the calls map {size} of {local} devices: the mesh needs {size}"


def inputs_and_outputs(
    runner: Runner, request: RunOriginal, module: ModuleType, fn: Any, variant: str
) -> tuple[list[Any], str, list[Any], list[str]]:
    """Return the calls (recorded, else declared, else synthesized), their source, the
    outputs of each, and the contexts the first call entered."""
    from .inputs import declared, recorded, synthesized
    from .outside import NotKept

    spec = request.inputs
    calls: list[Any] | None = None
    source = "recorded"
    if spec.recorded:
        try:
            calls = recorded(spec.recorded)
        except NotKept as exc:
            raise Unkept(str(exc)) from exc
    if calls is None:
        source = "declared"
        calls = declared(module, request.target.qualname)
    if calls is not None:
        results = [runner.call(fn, c, request, variant) for c in calls]
        return calls, source, [r[0] for r in results], results[0][1]
    if not spec.synthesize:
        raise NoInputs()
    return probe(
        runner,
        request,
        fn,
        synthesized(fn, spec.structure, spec.devices, spec.seed),
        variant,
    )


def factory_calls(
    runner: Runner, request: RunOriginal, variant: str
) -> tuple[list[Any], list[Any]]:
    """Run the function the target's last call returned (a factory's jitted function).

    On the calls recorded for it, else on synthesized ones; none if the target returned
    no function or nothing fits it.
    """
    from .inputs import recorded, synthesized
    from .layouts import LAYOUT, flat_out
    from .outside import NotKept
    from .recorder import function_like

    made = runner.last_output
    if not function_like(made):
        return [], []
    if getattr(made, LAYOUT, None) is not None and runner.steps is None:
        # a program-level step whose calls are not compared in the flat layout (on several
        # processes): its stacked calls fit the original alone; the command's calls judge it
        return [], []
    made = flat_out(made)  # a program-level step: its results in the rewrite's layout
    sub = returned_request(request)
    files = request.returned.recorded
    if files:
        try:
            calls = recorded(files)
        except NotKept as exc:
            raise Unkept(str(exc)) from exc
        return calls, [runner.call(made, c, sub, variant)[0] for c in calls]
    if not request.inputs.synthesize:
        return [], []
    candidates = synthesized(made, {"kind": "array"}, request.inputs.devices)
    try:
        calls, _, outputs, _ = probe(runner, sub, made, candidates, variant)
    except UserError:
        return [], []
    return calls, outputs


def probe(
    runner: Runner, request: RunOriginal, fn: Any, candidates: list[Any], variant: str
) -> tuple[list[Any], str, list[Any], list[str]]:
    """Run the first synthesized candidate the target accepts.

    A candidate that fails `jax.eval_shape` is the wrong shape; one that traces but then
    fails to run means the code cannot run on these inputs, and is reported as such.
    """
    last = "the target's parameters are unknown or static"
    for candidate in candidates:
        # A call without arguments (a `main()`, a training program) has no shape to get
        # wrong, and host code in it (`int(x)`, `print`) cannot be traced: it just runs.
        shaped = bool(candidate[0] or candidate[1])
        try:
            flat, notes = runner.call(fn, candidate, request, variant, probe=shaped)
        except UserError as exc:
            if exc.stage != "inputs":
                raise
            last = str(exc)
            continue
        return [candidate], "synthesized" if shaped else "run", [flat], notes
    raise UserError("inputs", f"could not synthesize arguments: {last}")
