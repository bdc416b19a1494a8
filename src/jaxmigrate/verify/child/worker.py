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


def load_pickle(path: str) -> Any:
    """Return the object pickled at `path`."""
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


STAGES = ("import", "target", "inputs", "call")
RETURNED = ".returned"  # suffix of the files holding a factory's returned function's calls
STEPS = ".steps"  # beside the outputs: the original's step calls are among them (`layouts`)


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
        f"the {calls} {source} call(s) of `{name}` never ran the site's {describe(missing)} "
        "(they took another path through it), so they show nothing about the rewrite"
    )


@dataclass
class Worker:
    """The state of one worker: its side, its tree, and the modules it has loaded."""

    side: str
    root: str
    modules: dict[tuple[str, str, str], ModuleType] = field(default_factory=dict)
    last_output: Any = None  # what the last call returned (a factory's function)
    steps: list[Any] | None = None  # a program-level pmap step's calls in a call (`layouts`)
    watch: Any = None  # a reach.Watch over the calls of the original's current attempt

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
        entry = os.path.join(self.root, spec["path"])
        if entry not in sys.path:
            sys.path.insert(0, entry)
        name = spec["module"]
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None
        module = importlib.util.module_from_spec(module_spec)
        previous = sys.modules.get(name)
        sys.modules[name] = module
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
        for part in spec["qualname"].split("."):
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
        from .hostify import flatten_output, from_host
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
            try:
                if probe:
                    jax.eval_shape(values_only(fn), *args, **kwargs)
                    stage = "call"
                if self.steps is not None:
                    self.steps.clear()
                lay(args, kwargs)  # a folder outside the tree, as it was when the call was recorded
                with self.watch if self.watch is not None else nullcontext():
                    self.last_output = fn(*args, **kwargs)
                flat = flatten_output(self.with_steps(self.last_output))
            except Exception as exc:
                raise UserError(stage, self.explain(exc)) from exc
            except BaseException as exc:  # sys.exit is not a shape problem
                raise UserError("call", self.explain(exc)) from exc
        return flat, notes

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

    def run_original(self, request: dict[str, Any]) -> dict[str, Any]:
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
        from .pickling import dumps

        module, fn = self.target(request, variant)
        self.watch = watcher(request, module, variant)
        try:
            calls, source, outputs, notes = self.inputs_and_outputs(request, module, fn, variant)
            returned, returned_outputs = self.factory_calls(request, variant)
        finally:
            watch, self.watch = self.watch, None
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
        reply = {
            "ok": True,
            "reference": variant,
            "source": source,
            "calls": len(calls),
            "returned_calls": len(returned),
            "input_shapes": shapes(calls[0]),
            "output_shapes": flat_shapes(outputs[0]),
            "contexts": notes,
        }
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

        for record in request.get("records", []):
            add_import_paths(record)
        try:
            _, fn = self.target(request, "candidate")
            calls, expected = self.load_io(request, "")
            returned, returned_expected = self.load_io(request, RETURNED)
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

        notes: list[str] = []
        worst = (0.0, 0.0)
        contexts: list[str] = []
        for i, (call, ref) in enumerate(zip(calls, expected)):
            flat, contexts = self.call(fn, call, request, "candidate")
            mismatch = compare(ref, flat, notes)
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
        if op == "run" and self.side == "original":
            return self.run_original(request)
        if op == "run":
            return self.run_candidate(request)
        return {"ok": False, "stage": "protocol", "error": f"unknown request {op!r}"}


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
    from .distributed import join

    join()  # one process of a multi-process job: join it before any other JAX use
    import jax

    ready = {"ready": True, "jax": jax.__version__, "devices": len(jax.devices())}
    ready |= {"process": jax.process_index(), "processes": jax.process_count()}
    out.write(json.dumps(ready) + "\n")
    serve(Worker(args.side, os.path.realpath(args.root)), inp, out)


if __name__ == "__main__":
    main()
