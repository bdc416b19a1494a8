"""A verification worker: one process, one side (original or candidate), many sites.

Started by the parent as `python -m _jaxmigrate_child.worker --side S --root R` with the
simulated-mesh environment, it limits its own address space, starts JAX once, then answers one
JSON request per line. The protocol uses private duplicates of stdin/stdout: the user's code sees
/dev/null as stdin and the worker's log as stdout, so prints cannot corrupt it. A request runs
the target on its inputs under its mesh contexts, blocks on every result, and either writes the
outputs (original side) or compares them with the original's (candidate side). Any exception
from user code, `SystemExit` included, becomes an error reply; a process forked by user code
exits before it can answer.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import pickle
import resource
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import IO, Any


def limit_memory(limit: int) -> None:
    """Cap this process's address space at `limit` bytes (0: no cap)."""
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def claim_stdio() -> tuple[IO[str], IO[str]]:
    """Return private protocol streams; point fd 0 at /dev/null and fd 1 at stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    inp = os.fdopen(os.dup(0), "r", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return inp, out


def describe(exc: BaseException) -> str:
    """Return one line naming an exception raised by user code."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: the code called sys.exit({exc.code!r})"
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def where(exc: BaseException, root: str) -> str:
    """Return `file:line` of the innermost traceback frame inside the tree, or ''."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith(root):
            return f"{os.path.relpath(frame.filename, root)}:{frame.lineno}"
    return ""


def load_pickle(path: str, default: Any = None) -> Any:
    """Return the object pickled at `path` (`default` if there is none and one is given)."""
    if default is not None and not os.path.exists(path):
        return default
    with open(path, "rb") as handle:
        return pickle.load(handle)


def values_only(fn: Any) -> Any:
    """Return `fn` with the outputs JAX cannot trace (a factory's function) dropped."""
    import jax

    from .compat import tree_map

    def traced(*args: Any, **kwargs: Any) -> Any:
        keep = (jax.Array, int, float, complex, bool)
        return tree_map(lambda x: x if isinstance(x, keep) else None, fn(*args, **kwargs))

    return traced


def ran_marker(request: dict[str, Any], side: str) -> str:
    """Return the file saying a call of `request` returned (removed: none is running), or ''.

    The parent reads it when the request times out: the time then went in flattening,
    saving and comparing the outputs, not in the user's code (`pool.Worker.request`).
    """
    path = request.get("outputs_path")
    if not path:
        return ""
    marker = f"{path}.{side}.ran"
    if os.path.exists(marker):
        os.remove(marker)
    return marker


STAGES = ("import", "target", "inputs", "call")
RETURNED = ".returned"  # suffix of the files holding a factory's returned function's calls
STEPS = ".steps"  # beside the outputs: the original's step calls are among them (`layouts`)
SHOWN = ".shown"  # beside the outputs: what each unit call printed and wrote (`shown`)
AGAIN = ".again"  # the inputs and outputs of the original's second run of a unit
SECOND_RUN_SHARE = 0.4  # a unit's original runs twice if its first run took under this share


def nondeterministic(why: str) -> dict[str, Any]:
    """Return the reply of an original that disagrees with itself."""
    error = f"the original is nondeterministic: {why}"
    return {"ok": False, "stage": "call", "error": error, "nondeterministic": True}


def second_paths(request: dict[str, Any]) -> dict[str, Any]:
    return {"outputs_path": request["outputs_path"] + AGAIN}


def shows(shown: list[Any], returned: bool) -> dict[str, Any]:
    """Return what a unit's comparison covers: its return value, printed lines, files."""
    lines = 0
    files: list[str] = []
    for one in shown:
        count, names = one.compared()
        lines += count
        files += [n for n in names if n not in files]
    return {"returned": returned, "printed": lines, "files": files}


class UserError(Exception):
    """User code failed at `stage` (import, target, inputs, call)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


class NotReached(UserError):
    """The calls ran the target but never the lines of (some of) its sites."""

    def __init__(self, message: str) -> None:
        super().__init__("reach", message)


class Unkept(UserError):
    """A recorded call's folder outside the tree could not be kept as it was (`outside`)."""

    def __init__(self, message: str) -> None:
        super().__init__("inputs", message)


class Uncomparable(UserError):
    """The call ran, but what it returned cannot be flattened to be compared."""

    def __init__(self, message: str) -> None:
        super().__init__("call", message)


class NoInputs(UserError):
    """Nothing was recorded or declared for the target, and synthesis is off."""

    def __init__(self) -> None:
        super().__init__("inputs", "no inputs were recorded or declared")


def watcher(request: dict[str, Any], module: ModuleType, variant: str) -> Any:
    """Return a Watch over the sites' lines for a function target's calls, else None.

    A callable target (`step = jax.pmap(f)`) is its site: calling it runs the rewrite. A
    module with the safe rewrites applied may have other line numbers: not watched.
    """
    from .reach import Watch, spans_of
    from .references import SAFE_REWRITES

    spans = request.get("reach")
    filename = getattr(module, "__file__", None)
    if not spans or variant.startswith(SAFE_REWRITES) or not filename:
        return None
    return Watch(filename, spans_of(spans))


def not_reached(request: dict[str, Any], source: str, calls: int, missing: Any) -> str:
    """Return why a target's calls verify nothing: they never ran (some of) its sites."""
    from .reach import describe

    name = request["target"]["qualname"]
    return (
        f"the {calls} {source} call(s) of `{name}` {describe(missing)} "
        "(they took another path through it), so they show nothing about the rewrite"
    )


@dataclass
class Worker:
    """The state of one worker: its side, its tree, and the modules it has loaded."""

    side: str
    root: str
    modules: dict[tuple[str, str, str], ModuleType] = field(default_factory=dict)
    pristine: str | None = None  # the user's tree, to lay back a file a unit changed (`shown`)
    shown: list[Any] = field(default_factory=list)  # what each unit call showed (`shown.Shown`)
    unit_variants: list[str] = field(default_factory=list)  # the variants that ran a unit
    last_output: Any = None  # what the last call returned (a factory's function)
    steps: list[Any] | None = None  # a program-level pmap step's calls in a call (`layouts`)
    watch: Any = None  # a reach.Watch over the calls of the original's current attempt
    observed: Any = None  # an observe.Observed: what the current attempt's calls compiled

    # Modules ------------------------------------------------------------------------------
    def load(self, spec: dict[str, Any], variant: str) -> ModuleType:
        """Execute the module `spec` names (its `text`, else its file) once per variant."""
        path = os.path.join(self.root, spec["file"])
        text = spec.get("text")
        if text is None:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        key = (spec["module"], variant, hashlib.sha1(text.encode()).hexdigest())
        if key not in self.modules:
            self.modules[key] = self.execute(
                spec, path, text, keep=variant in {"original", "candidate"}
            )
        return self.modules[key]

    def execute(self, spec: dict[str, Any], path: str, text: str, keep: bool) -> ModuleType:
        from .isolation import seed

        entry = os.path.join(self.root, spec["path"])
        if entry not in sys.path:
            sys.path.insert(0, entry)
        name = spec["module"]
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None
        module = importlib.util.module_from_spec(module_spec)
        previous = sys.modules.get(name)
        sys.modules[name] = module
        seed()  # module-level draws (`DATA = np.random.rand(8)`) alike on both sides
        try:
            exec(compile(text, path, "exec"), module.__dict__)  # noqa: S102 - this is the point
        except BaseException:
            self.restore(name, previous)
            raise
        if not keep:
            self.restore(name, previous)
        return module

    @staticmethod
    def restore(name: str, previous: ModuleType | None) -> None:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous

    # Running ------------------------------------------------------------------------------
    def target(self, request: dict[str, Any], variant: str) -> tuple[ModuleType, Any]:
        """Return the target's module and the callable named by its qualname."""
        from .references import SAFE_REWRITES

        spec = request["target"]
        if variant.startswith(SAFE_REWRITES):
            spec = spec | {"text": spec["baseline"]}
        try:
            module = self.load(spec, variant)
        except BaseException as exc:
            raise UserError("import", self.explain(exc)) from exc
        obj: Any = module
        for part in spec.get("call_as", spec["qualname"]).split("."):
            obj = getattr(obj, part, None)
        if not callable(obj):
            kind = type(obj).__name__
            raise UserError("target", f"`{spec['qualname']}` is a {kind}, not a function")
        return module, obj

    def explain(self, exc: BaseException) -> str:
        at = where(exc, self.root)
        return describe(exc) + (f" (at {at})" if at else "")

    def call(
        self,
        fn: Any,
        call: Any,
        request: dict[str, Any],
        variant: str,
        probe: bool = False,
    ) -> tuple[Any, list[str]]:
        """Run one call under the request's mesh contexts; return the flattened output.

        With `probe`, the call is first traced with `jax.eval_shape`: a failure there is an
        input problem (stage "inputs"), not a failure of the code.
        """
        import jax

        from .contexts import build_mesh, enter
        from .hostify import Unflattenable, flatten_output, from_host
        from .isolation import seed
        from .observe import observing
        from .outside import lay

        args, kwargs = from_host(call)
        meshes = [build_mesh(d) for d in request.get("meshes", [])]
        with ExitStack() as stack:
            notes = [
                enter(stack, expr, self.context_namespace(ctx, request, variant), meshes)
                for ctx in request.get("contexts", [])
                for expr in ctx["exprs"]
            ]
            stage = "inputs" if probe else "call"
            # the probe's trace is the call's (jit reuses it), and host callbacks may run
            # until the outputs are ready: all of it is watched (`reach`)
            watch = self.watch if self.watch is not None else nullcontext()
            seen = set(self.watch.hit) if self.watch is not None else set()
            try:
                with watch:
                    if probe:
                        jax.eval_shape(values_only(fn), *args, **kwargs)
                        stage = "call"
                    if self.steps is not None:
                        self.steps.clear()
                    lay(args, kwargs)  # a folder outside the tree, as it was when recorded
                    unit = not args and not kwargs  # the program itself runs: what it shows counts
                    ran = ran_marker(request, self.side)
                    started = time.monotonic()
                    with (
                        self.showing(variant) if unit else nullcontext(),
                        observing(self.observed),
                    ):
                        seed()
                        self.last_output = fn(*args, **kwargs)
                        if ran:  # a timeout from here on is the outputs' handling, not the code's
                            with open(ran, "w", encoding="utf-8") as handle:
                                handle.write(f"{time.monotonic() - started:.1f}\n")
                        try:
                            flat = flatten_output(self.with_steps(self.last_output))
                        except Unflattenable as exc:
                            raise Uncomparable(str(exc)) from exc
                        jax.effects_barrier()
                    if self.observed is not None:
                        self.observed.add_output(self.last_output)
            except UserError:
                raise
            except Exception as exc:
                if stage == "inputs" and self.watch is not None:  # a candidate not taken
                    self.watch.hit = seen
                raise UserError(stage, self.explain(exc)) from exc
            except BaseException as exc:  # sys.exit is not a shape problem
                raise UserError("call", self.explain(exc)) from exc
        return flat, notes

    @contextmanager
    def showing(self, variant: str) -> Iterator[None]:
        """Keep what a unit call prints and writes in the tree (`shown`), then undo its writes."""
        from .shown import Shown, files_kept, placed, stdout_captured

        self.unit_variants.append(variant)
        shown = Shown()
        self.shown.append(shown)
        with files_kept(self.root, self.pristine, read=True) as changes, stdout_captured() as out:
            yield
        # each side runs in its own copy: a path in it is printed as `<tree>` on both
        shown.printed = placed(out, self.root)
        shown.files = {
            rel: ("text", placed(entry[1], self.root)) if entry[0] == "text" else entry
            for rel, entry in changes.files.items()
        }

    def with_steps(self, output: Any) -> Any:
        """Return a call's output, with the step calls it made when they are compared too."""
        if self.steps is None:
            return output
        return {"output": output, "step calls (flat layout)": list(self.steps)}

    def context_namespace(
        self, ctx: dict[str, Any], request: dict[str, Any], variant: str
    ) -> dict[str, Any]:
        """Return the namespace in which a context's with-items are evaluated.

        Another file's module (often the script that ran the program) that cannot be executed
        here, and that the rewrite did not change, lends no names: the with-item's names are
        then bound to the mesh recorded at the call.
        """
        if ctx["module"]["file"] == request["target"]["file"]:
            return vars(self.target(request, variant)[0])
        try:
            return vars(self.load(ctx["module"], variant))
        except BaseException as exc:
            if self.side == "original" or ctx["module"].get("text") is None:
                return {}
            raise UserError("import", self.explain(exc)) from exc

    def run_original(self, request: dict[str, Any], state: Any = None) -> dict[str, Any]:
        """Run the original (or its first reference that runs); write inputs and outputs.

        A unit (a call without arguments: the program) is run twice, each time from the state
        the program starts in (`state`, laid back in between): if the runs disagree, or only one
        raises, the original is nondeterministic and nothing can be compared with it; what it
        prints or writes differently in the two runs is left out of the comparison.
        """
        from .references import ORIGINAL

        self.unit_variants = []
        started = time.monotonic()
        first = self.run_references(request)
        if ORIGINAL not in self.unit_variants or state is None:
            return first
        took = time.monotonic() - started
        budget = float(request.get("timeout") or 0)
        if budget and took > SECOND_RUN_SHARE * budget:  # a second run would not fit
            why = f"not checked: one run took {took:.0f} s of the {budget:g} s allowed"
            return first | {"determinism": why}
        self.lay_back(state)
        again = request | {
            "references": [ORIGINAL],
            "inputs_path": request["inputs_path"] + AGAIN,
            "outputs_path": request["outputs_path"] + AGAIN,
        }
        second = self.run_references(again)
        return self.against_second(request, first, second)

    def lay_back(self, state: Any) -> None:
        """Lay the process back in the state a program starts in; forget the loaded modules."""
        from .isolation import restore

        restore(state, self.root)
        self.modules.clear()

    def against_second(
        self, request: dict[str, Any], first: dict[str, Any], second: dict[str, Any]
    ) -> dict[str, Any]:
        """Return the first run's reply, or why the original disagrees with itself."""
        from .compare import compare
        from .references import ORIGINAL
        from .shown import left_out, varying

        first_ok = bool(first.get("ok")) and first.get("reference") == ORIGINAL
        if first_ok != bool(second.get("ok")):
            failed = second if first_ok else first
            errors = failed.get("reference_errors") or failed.get("errors") or []
            error = next(
                (e.split(": ", 1)[1] for e in errors if e.startswith(f"{ORIGINAL}: ")),
                str(failed.get("error", "")),
            )
            return nondeterministic(f"it raised in one of two runs and not in the other ({error})")
        if not first_ok:
            return first
        outputs = [load_pickle(r["outputs_path"]) for r in (request, second_paths(request))]
        for i, (a, b) in enumerate(zip(*outputs)):
            found = compare(a, b)
            if found is not None:
                return nondeterministic(
                    f"two runs disagree at {found['path']} of call {i + 1} ({found['why']})"
                )
        shown_path = request["outputs_path"] + SHOWN
        if os.path.exists(shown_path):
            runs = [
                load_pickle(r["outputs_path"] + SHOWN) for r in (request, second_paths(request))
            ]
            kept = [varying(a, b) for a, b in zip(*runs)]
            with open(shown_path, "wb") as handle:
                pickle.dump(kept, handle)
            first["shows"] = shows(kept, first["shows"]["returned"])
            note = left_out(kept[0]) if kept else ""
            if note:
                first["shows"]["left_out"] = note
        return first

    def run_references(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the original (or its first reference that runs); write inputs and outputs."""
        from .references import reference

        errors: list[str] = []
        stages: dict[str, str] = {}
        furthest: UserError | None = None
        for name in request["references"]:
            with reference(name), self.layouts_checked(request, name) as violations:
                try:
                    reply = self.attempt(request, name)
                    if violations:
                        reply["layout_violations"] = violations
                except NoInputs as exc:
                    return {"ok": False, "stage": exc.stage, "error": str(exc), "no_inputs": True}
                except NotReached as exc:  # another reference takes the same path
                    return {"ok": False, "stage": exc.stage, "error": str(exc), "not_reached": True}
                except Uncomparable as exc:  # it ran: another reference returns the same
                    error = str(exc)
                    return {"ok": False, "stage": exc.stage, "error": error, "uncomparable": True}
                except Unkept as exc:  # no reference can start from the files as they were
                    return {"ok": False, "stage": exc.stage, "error": str(exc), "not_kept": True}
                except UserError as exc:
                    errors.append(f"{name}: {exc}")
                    stages[name] = exc.stage
                    if furthest is None or STAGES.index(exc.stage) > STAGES.index(furthest.stage):
                        furthest = exc
                    continue
            if errors:
                reply["reference_errors"] = errors
                reply["reference_stages"] = stages
            return reply
        stage, error = (furthest.stage, str(furthest)) if furthest else ("inputs", "no reference")
        return {"ok": False, "stage": stage, "error": error, "errors": errors}

    @contextmanager
    def layouts_checked(self, request: dict[str, Any], variant: str) -> Iterator[list[str]]:
        """Check the original's pmapped steps against what program-level rewrites assume of
        them (`child.layouts`); yield where they do not hold (nothing to check: no list)."""
        import jax

        from .layouts import checking
        from .references import ORIGINAL

        if variant != ORIGINAL or not request.get("layouts"):
            yield []
            return
        path = os.path.join(self.root, request["target"]["file"])
        layouts = request["layouts"]
        # The step calls are compared when the rewrite's step was found, in one process (a
        # global array is not readable whole from one process).
        compared = jax.process_count() == 1 and all("candidate_line" in lay for lay in layouts)
        self.steps = [] if compared else None
        marker = request["outputs_path"] + STEPS
        if os.path.exists(marker):  # from a reference tried before
            os.remove(marker)
        try:
            with checking(layouts, path, self.steps) as found:
                yield found
                if compared:  # the outputs hold the step calls: the rewrite's side too
                    with open(marker, "w", encoding="utf-8") as handle:
                        handle.write("flat layout\n")
        finally:
            self.steps = None

    def attempt(self, request: dict[str, Any], variant: str) -> dict[str, Any]:
        from .hostify import flat_shapes, shapes
        from .observe import Observed
        from .pickling import dumps
        from .values import Opaque

        module, fn = self.target(request, variant)
        self.watch = watcher(request, module, variant)
        self.shown = []
        if self.watch is not None:  # every trace the calls use is made, and seen, below
            import jax

            jax.clear_caches()
        self.observed = observed = Observed()
        try:
            calls, source, outputs, notes = self.inputs_and_outputs(request, module, fn, variant)
            returned, returned_outputs = self.factory_calls(request, variant)
        finally:
            watch, self.watch, self.observed = self.watch, None, None
        if watch is not None and watch.missing:
            raise NotReached(not_reached(request, source, len(calls), watch.missing))
        for path, value in (
            (request["inputs_path"], calls),
            (request["outputs_path"], outputs),
            (request["inputs_path"] + RETURNED, returned),
            (request["outputs_path"] + RETURNED, returned_outputs),
        ):
            with open(path, "wb") as handle:
                handle.write(dumps(value))
        reply: dict[str, Any] = {
            "ok": True,
            "reference": variant,
            "source": source,
            "calls": len(calls),
            "returned_calls": len(returned),
            "input_shapes": shapes(calls[0]),
            "output_shapes": flat_shapes(outputs[0]),
            "contexts": notes,
            "observed": observed.summary(),
        }
        if self.shown:  # a unit ran: what it printed and wrote is compared too
            with open(request["outputs_path"] + SHOWN, "wb") as handle:
                pickle.dump(self.shown, handle)
            has_return = any(
                not isinstance(leaf, Opaque)
                for flat in [*outputs, *returned_outputs]
                for _, leaf in flat.leaves
            )
            reply["shows"] = shows(self.shown, has_return)
        return reply | self.mesh_size(calls[0], request["inputs"]["structure"])

    @staticmethod
    def mesh_size(call: Any, structure: dict[str, Any]) -> dict[str, Any]:
        """Return how many devices the pmap calls map, with a hint when not all of them."""
        import jax

        from .inputs import mapped_size

        size = mapped_size(call, structure)
        if size is None:
            return {}
        local = jax.local_device_count()  # a pmap maps its process's devices
        if size == local:
            return {"mapped_axis_size": size}
        hint = f"the calls map {size} of {local} devices: the mesh needs {size}"
        return {"mapped_axis_size": size, "mesh_hint": hint}

    def inputs_and_outputs(
        self, request: dict[str, Any], module: ModuleType, fn: Any, variant: str
    ) -> tuple[list[Any], str, list[Any], list[str]]:
        from .inputs import declared, recorded, synthesized
        from .outside import NotKept

        spec = request["inputs"]
        calls: list[Any] | None = None
        source = "recorded"
        if spec.get("recorded"):
            try:
                calls = recorded(spec["recorded"])
            except NotKept as exc:
                raise Unkept(str(exc)) from exc
        if calls is None:
            source = "declared"
            calls = declared(module, request["target"]["qualname"])
        if calls is not None:
            results = [self.call(fn, c, request, variant) for c in calls]
            return calls, source, [r[0] for r in results], results[0][1]
        if not spec.get("synthesize"):
            raise NoInputs()
        return self.probe(
            request,
            fn,
            synthesized(fn, spec["structure"], spec["devices"], spec.get("seed", 0)),
            variant,
        )

    @staticmethod
    def returned_request(request: dict[str, Any]) -> dict[str, Any]:
        """Return `request` with the contexts of the calls of a factory's returned function."""
        part = request.get("returned") or {}
        return request | {"contexts": part.get("contexts", []), "meshes": part.get("meshes", [])}

    def factory_calls(self, request: dict[str, Any], variant: str) -> tuple[list[Any], list[Any]]:
        """Run the function the target's last call returned (a factory's jitted function).

        On the calls recorded for it, else on synthesized ones; none if the target returned
        no function or nothing fits it.
        """
        from .inputs import recorded, synthesized
        from .outside import NotKept
        from .recorder import function_like

        made = self.last_output
        if not function_like(made):
            return [], []
        sub = self.returned_request(request)
        files = (request.get("returned") or {}).get("recorded")
        if files:
            try:
                calls = recorded(files)
            except NotKept as exc:
                raise Unkept(str(exc)) from exc
            return calls, [self.call(made, c, sub, variant)[0] for c in calls]
        if not request["inputs"].get("synthesize"):
            return [], []
        candidates = synthesized(made, {"kind": "array"}, request["inputs"]["devices"])
        try:
            calls, _, outputs, _ = self.probe(sub, made, candidates, variant)
        except UserError:
            return [], []
        return calls, outputs

    def probe(self, request: dict[str, Any], fn: Any, candidates: list[Any], variant: str) -> Any:
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
                flat, notes = self.call(fn, candidate, request, variant, probe=shaped)
            except UserError as exc:
                if exc.stage != "inputs":
                    raise
                last = str(exc)
                continue
            return [candidate], "synthesized" if shaped else "run", [flat], notes
        raise UserError("inputs", f"could not synthesize arguments: {last}")

    def run_candidate(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the rewrite on the original's inputs and compare with the original's outputs.

        A factory's returned function is then run on the calls recorded for the original's.
        """
        from .compare import has_values
        from .inputs import add_import_paths
        from .observe import Observed

        for record in request.get("records", []):
            add_import_paths(record)
        try:
            _, fn = self.target(request, "candidate")
            calls, expected = self.load_io(request, "")
            returned, returned_expected = self.load_io(request, RETURNED)
            self.observed = observed = Observed()
            with self.steps_captured(request):
                first = self.compare_calls(fn, calls, expected, request, "")
                if not first.get("equal") or not returned:
                    reply = first
                else:
                    sub = self.returned_request(request)
                    last = self.last_output
                    reply = self.compare_calls(last, returned, returned_expected, sub, "r")
        except UserError as exc:
            return {"ok": False, "stage": exc.stage, "error": str(exc)}
        finally:
            self.observed = None
        if not reply.get("equal"):
            return reply
        notes = first["not_comparable"] + (reply["not_comparable"] if returned else [])
        return reply | {
            "calls": len(calls),
            "returned_calls": len(returned),
            "max_abs_err": max(first["max_abs_err"], reply["max_abs_err"]),
            "max_rel_err": max(first["max_rel_err"], reply["max_rel_err"]),
            "not_comparable": list(dict.fromkeys(notes))[:5],
            "has_values": any(has_values(r) for r in [*expected, *returned_expected]),
            "observed": observed.summary(),
        }

    @contextmanager
    def steps_captured(self, request: dict[str, Any]) -> Iterator[None]:
        """Keep the rewrite's step calls in each call when the original kept its own."""
        from .layouts import capturing

        if not os.path.exists(request["outputs_path"] + STEPS) or not request.get("layouts"):
            yield
            return
        self.steps = []
        path = os.path.join(self.root, request["target"]["file"])
        try:
            with capturing(request["layouts"], path, self.steps):
                yield
        finally:
            self.steps = None

    @staticmethod
    def load_io(request: dict[str, Any], suffix: str) -> tuple[list[Any], list[Any]]:
        """Return the inputs and outputs the original side wrote (none if it wrote none)."""
        loaded = []
        for key in ("inputs_path", "outputs_path"):
            try:
                with open(request[key] + suffix, "rb") as handle:
                    loaded.append(pickle.load(handle))
            except FileNotFoundError:
                loaded.append([])
        return loaded[0], loaded[1]

    def compare_calls(
        self, fn: Any, calls: list[Any], expected: list[Any], request: dict[str, Any], kind: str
    ) -> dict[str, Any]:
        """Run `fn` on each call and compare with `expected`; stop at the first difference."""
        from .compare import compare, max_errors
        from .shown import shown_mismatch

        notes: list[str] = []
        worst = (0.0, 0.0)
        contexts: list[str] = []
        shown = load_pickle(request["outputs_path"] + SHOWN, []) if not kind else []
        self.shown = []
        for i, (call, ref) in enumerate(zip(calls, expected)):
            flat, contexts = self.call(fn, call, request, "candidate")
            mismatch = compare(ref, flat, notes)
            if mismatch is None and i < len(shown) and self.shown:
                mismatch = shown_mismatch(shown[i], self.shown[-1])
            if mismatch is not None:
                where = {"call": i} | ({"returned": True} if kind else {})
                reply = {"ok": True, "equal": False, "mismatch": mismatch | where}
                return reply | {"candidate_contexts": contexts}
            errs = max_errors(ref, flat)
            worst = (max(worst[0], errs[0]), max(worst[1], errs[1]))
        return {
            "ok": True,
            "equal": True,
            "max_abs_err": worst[0],
            "max_rel_err": worst[1],
            "candidate_contexts": contexts,
            "not_comparable": notes,
        }

    def compare_records(self, request: dict[str, Any]) -> dict[str, Any]:
        """Compare the calls a command recorded on both trees: inputs first, then outputs.

        Inputs that differ mean the runs diverged before the site (not the site's fault).
        """
        from .compare import compare, has_values, max_errors
        from .hostify import flatten_output, from_host
        from .inputs import add_import_paths

        # what was pickled by name from a folder the command imported (the script's folder,
        # `examples/imagenet` when the tree is the repository) is found from there
        for orig, cand in zip(request["original"], request["candidate"]):
            add_import_paths(orig[0])
            add_import_paths(cand[0])
        notes: list[str] = []
        worst = (0.0, 0.0)
        expected = []
        for i, (orig, cand) in enumerate(zip(request["original"], request["candidate"])):
            try:
                (orig_in, orig_out), (cand_in, cand_out) = (
                    [load_pickle(path) for path in orig],
                    [load_pickle(path) for path in cand],
                )
            except OSError:
                return {"ok": False, "error": f"the output of call {i + 1} was not recorded"}
            found = compare(flatten_output(from_host(orig_in)), flatten_output(from_host(cand_in)))
            if found is not None:
                return {"ok": True, "diverged": found | {"call": i}}
            found = compare(orig_out, cand_out, notes)
            if found is not None:
                return {"ok": True, "equal": False, "mismatch": found | {"call": i}}
            errs = max_errors(orig_out, cand_out)
            worst = (max(worst[0], errs[0]), max(worst[1], errs[1]))
            expected.append(orig_out)
        return {
            "ok": True,
            "equal": True,
            "max_abs_err": worst[0],
            "max_rel_err": worst[1],
            "not_comparable": list(dict.fromkeys(notes))[:5],
            "has_values": any(has_values(r) for r in expected),
        }

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        from .distributed import localize

        request = localize(request)
        op = request.get("op")
        if op == "compare_records":
            return self.compare_records(request)
        if op == "run":
            return self.isolated(request)
        return {"ok": False, "stage": "protocol", "error": f"unknown request {op!r}"}

    def isolated(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one target from the state a program starts in, and lay that state back after.

        What the run cannot be undone of (`isolation.restore`) is reported as `restart`: the
        parent starts this worker again before the next request.
        """
        from .isolation import restore, snapshot
        from .shown import files_kept

        self.pristine = request.get("pristine")
        state = snapshot()
        try:
            with files_kept(self.root, self.pristine, read=False):
                if self.side == "original":
                    reply = self.run_original(request, state)
                else:
                    reply = self.run_candidate(request)
        finally:
            why = restore(state, self.root)
            self.modules.clear()
        if why:
            print(f"jaxmigrate worker: starting again: {why}", file=sys.stderr)
            reply["restart"] = why
        return reply


def serve(worker: Worker, inp: IO[str], out: IO[str]) -> None:
    """Answer requests until stdin closes; a forked copy of this process exits silently."""
    pid = os.getpid()
    for line in inp:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        try:
            reply = worker.handle(request)
        except Exception as exc:  # noqa: BLE001 - a worker bug is a reply, not a hang
            reply = {"ok": False, "stage": "worker", "error": f"worker error: {describe(exc)}"}
        if os.getpid() != pid:
            os._exit(0)
        out.write(json.dumps(reply, default=str) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="_jaxmigrate_child.worker")
    parser.add_argument("--side", choices=("original", "candidate"), required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--memory", type=int, default=0)
    args = parser.parse_args(argv)
    limit_memory(args.memory)
    inp, out = claim_stdio()
    warnings.simplefilter("ignore")
    os.chdir(args.root)
    from .distributed import alone, join

    join()  # one process of a multi-process job: join it before any other JAX use
    alone()  # or a job of one: the program's own `jax.distributed.initialize()` does nothing
    import jax

    ready = {"ready": True, "jax": jax.__version__, "devices": len(jax.devices())}
    ready |= {"process": jax.process_index(), "processes": jax.process_count()}
    out.write(json.dumps(ready) + "\n")
    serve(Worker(args.side, os.path.realpath(args.root)), inp, out)


if __name__ == "__main__":
    main()
