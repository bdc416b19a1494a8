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
from contextlib import ExitStack
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


STAGES = ("import", "target", "inputs", "call")


class UserError(Exception):
    """User code failed at `stage` (import, target, inputs, call)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


class NoInputs(UserError):
    """Nothing was recorded or declared for the target, and synthesis is off."""

    def __init__(self) -> None:
        super().__init__("inputs", "no inputs were recorded or declared")


@dataclass
class Worker:
    """The state of one worker: its side, its tree, and the modules it has loaded."""

    side: str
    root: str
    modules: dict[tuple[str, str, str], ModuleType] = field(default_factory=dict)

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
            raise UserError("target", f"{spec['module']}.{spec['qualname']} is not a callable")
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

        args, kwargs = from_host(call)
        meshes = [build_mesh(d) for d in request.get("meshes", [])]
        with ExitStack() as stack:
            notes = [
                enter(stack, expr, vars(self.context_module(ctx, request, variant)), meshes)
                for ctx in request.get("contexts", [])
                for expr in ctx["exprs"]
            ]
            stage = "inputs" if probe else "call"
            try:
                if probe:
                    jax.eval_shape(fn, *args, **kwargs)
                    stage = "call"
                flat = flatten_output(fn(*args, **kwargs))
            except Exception as exc:
                raise UserError(stage, self.explain(exc)) from exc
            except BaseException as exc:  # sys.exit is not a shape problem
                raise UserError("call", self.explain(exc)) from exc
        return flat, notes

    def context_module(
        self, ctx: dict[str, Any], request: dict[str, Any], variant: str
    ) -> ModuleType:
        """Return the module in whose namespace a context's with-items are evaluated."""
        if ctx["module"]["file"] == request["target"]["file"]:
            return self.target(request, variant)[0]
        try:
            return self.load(ctx["module"], variant)
        except BaseException as exc:
            raise UserError("import", self.explain(exc)) from exc

    def run_original(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the original (or its first reference that runs); write inputs and outputs."""
        from .references import reference

        errors: list[str] = []
        furthest: UserError | None = None
        for name in request["references"]:
            with reference(name):
                try:
                    reply = self.attempt(request, name)
                except NoInputs as exc:
                    return {"ok": False, "stage": exc.stage, "error": str(exc), "no_inputs": True}
                except UserError as exc:
                    errors.append(f"{name}: {exc}")
                    if furthest is None or STAGES.index(exc.stage) > STAGES.index(furthest.stage):
                        furthest = exc
                    continue
            if errors:
                reply["reference_errors"] = errors
            return reply
        stage, error = (furthest.stage, str(furthest)) if furthest else ("inputs", "no reference")
        return {"ok": False, "stage": stage, "error": error, "errors": errors}

    def attempt(self, request: dict[str, Any], variant: str) -> dict[str, Any]:
        from .hostify import flat_shapes, shapes

        module, fn = self.target(request, variant)
        calls, source, outputs, notes = self.inputs_and_outputs(request, module, fn, variant)
        with open(request["inputs_path"], "wb") as handle:
            pickle.dump(calls, handle)
        with open(request["outputs_path"], "wb") as handle:
            pickle.dump(outputs, handle)
        reply = {
            "ok": True,
            "reference": variant,
            "source": source,
            "calls": len(calls),
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

        spec = request["inputs"]
        calls: list[Any] | None = None
        source = "recorded"
        if spec.get("recorded"):
            calls = recorded(spec["recorded"])
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

    def probe(self, request: dict[str, Any], fn: Any, candidates: list[Any], variant: str) -> Any:
        """Run the first synthesized candidate the target accepts.

        A candidate that fails `jax.eval_shape` is the wrong shape; one that traces but then
        fails to run means the code cannot run on these inputs, and is reported as such.
        """
        last = "the target's parameters are unknown or static"
        for candidate in candidates:
            try:
                flat, notes = self.call(fn, candidate, request, variant, probe=True)
            except UserError as exc:
                if exc.stage != "inputs":
                    raise
                last = str(exc)
                continue
            return [candidate], "synthesized", [flat], notes
        raise UserError("inputs", f"could not synthesize arguments: {last}")

    def run_candidate(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the rewrite on the original's inputs and compare with the original's outputs."""
        from .compare import compare, max_errors

        try:
            _, fn = self.target(request, "candidate")
            with open(request["inputs_path"], "rb") as handle:
                calls = pickle.load(handle)
            with open(request["outputs_path"], "rb") as handle:
                expected = pickle.load(handle)
            worst = (0.0, 0.0)
            for i, (call, ref) in enumerate(zip(calls, expected)):
                flat, notes = self.call(fn, call, request, "candidate")
                mismatch = compare(ref, flat)
                if mismatch is not None:
                    return {
                        "ok": True,
                        "equal": False,
                        "mismatch": {**mismatch, "call": i},
                        "candidate_contexts": notes,
                    }
                errs = max_errors(ref, flat)
                worst = (max(worst[0], errs[0]), max(worst[1], errs[1]))
        except UserError as exc:
            return {"ok": False, "stage": exc.stage, "error": str(exc)}
        return {
            "ok": True,
            "equal": True,
            "calls": len(calls),
            "max_abs_err": worst[0],
            "max_rel_err": worst[1],
            "candidate_contexts": notes,
        }

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        from .distributed import localize

        request = localize(request)
        op = request.get("op")
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
