"""What every request of a worker shares: its state, loading modules, and running one call.

A `Runner` is one worker's side (original or candidate), its tree, and the modules it loaded;
the handlers (`original`, `candidate`, `records`) run targets through it. `isolated` runs one
request from the state a program starts in and lays that state back after.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from .protocol import SCRIPT, Context, Module, Reply, Run, Target

RETURNED = ".returned"  # suffix of the files holding a factory's returned function's calls
STEPS = ".steps"  # beside the outputs: the original's step calls are among them (`layouts`)
SHOWN = ".shown"  # beside the outputs: what each unit call printed and wrote (`shown`)

R = TypeVar("R", bound=Run)


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


def ran_marker(request: Run, side: str) -> str:
    """Return the file saying a call of `request` returned (removed: none is running), or ''.

    The parent reads it when the request times out: the time then went in flattening,
    saving and comparing the outputs, not in the user's code (`pool.Worker.request`).
    """
    if not request.outputs_path:
        return ""
    marker = f"{request.outputs_path}.{side}.ran"
    if os.path.exists(marker):
        os.remove(marker)
    return marker


def returned_request(request: R) -> R:
    """Return `request` under the contexts of the calls of a factory's returned function."""
    part = request.returned
    return dataclasses.replace(request, contexts=part.contexts, meshes=part.meshes)


class UserError(Exception):
    """User code failed at `stage` (import, target, inputs, call); `missing`, the top-level
    module whose absence failed it (`ModuleNotFoundError`), if that is why."""

    def __init__(self, stage: str, message: str, missing: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.missing = missing


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


@dataclass
class Runner:
    """The state of one worker: its side, its tree, and the modules it has loaded."""

    side: str
    root: str
    modules: dict[tuple[str, str, str, int], ModuleType] = field(default_factory=dict)
    pristine: str | None = None  # the user's tree, to lay back a file a unit changed (`shown`)
    shown: list[Any] = field(default_factory=list)  # what each unit call showed (`shown.Shown`)
    unit_variants: list[str] = field(default_factory=list)  # the variants that ran a unit
    last_output: Any = None  # what the last call returned (a factory's function)
    steps: list[Any] | None = None  # a program-level pmap step's calls in a call (`layouts`)
    patched: int = 0  # bumped as each request patches jax to watch its steps (`layouts`)
    watch: Any = None  # a reach.Watch over the calls of the original's current attempt
    observed: Any = None  # an observe.Observed: what the current attempt's calls compiled

    # Modules ------------------------------------------------------------------------------
    def load(self, spec: Module, variant: str, watched: bool = False) -> ModuleType:
        """Execute the module `spec` names (its `text`, else its file) once per variant, and
        once more for each request checking program-level steps (`watched`, `layouts`): it
        imports the module under its own patches of jax (`patched`), a step made at module
        level being made at import, bound to that request's lists."""
        path, text = self.source(spec)
        key = (
            spec.module,
            variant,
            hashlib.sha1(text.encode()).hexdigest(),
            watched and self.patched,
        )
        if key not in self.modules:
            self.modules[key] = self.execute(
                spec, path, text, keep=variant in {"original", "candidate"}
            )
        return self.modules[key]

    def source(self, spec: Module) -> tuple[str, str]:
        """Return the path of the module `spec` names and its text (`spec.text`, else the
        file's); its folder is importable from then on."""
        path = os.path.join(self.root, spec.file)
        text = spec.text
        if text is None:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        entry = os.path.join(self.root, spec.path)
        if entry not in sys.path:
            sys.path.insert(0, entry)
        return path, text

    def execute(self, spec: Module, path: str, text: str, keep: bool) -> ModuleType:
        from .isolation import seed

        name = spec.module
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

    def lay_back(self, state: Any) -> None:
        """Lay the process back in the state a program starts in; forget the loaded modules."""
        from .isolation import restore

        restore(state, self.root)
        self.modules.clear()

    # Running ------------------------------------------------------------------------------
    def target(self, request: Run, variant: str) -> tuple[ModuleType, Any]:
        """Return the target's module and the callable named by its qualname."""
        from .references import SAFE_REWRITES

        spec: Target = request.target
        if variant.startswith(SAFE_REWRITES):
            spec = dataclasses.replace(spec, text=spec.baseline)
        if spec.qualname == SCRIPT:
            return self.script(spec)
        try:
            module = self.load(spec, variant, watched=bool(getattr(request, "layouts", None)))
        except BaseException as exc:
            raise self.failure("import", exc) from exc
        obj: Any = module
        for part in (spec.call_as or spec.qualname).split("."):
            obj = getattr(obj, part, None)
        if not callable(obj):
            kind = type(obj).__name__
            raise UserError("target", f"`{spec.qualname}` is a {kind}, not a function")
        return module, obj

    def script(self, spec: Target) -> tuple[ModuleType, Any]:
        """Return a module standing for the script and a function running it as `python
        file.py` does (`__name__ == "__main__"`, its statements then its main block): a unit,
        whose run shows what it prints and writes, and the step calls it makes."""
        try:
            path, text = self.source(spec)
            code = compile(text, path, "exec")
        except BaseException as exc:
            raise self.failure("import", exc) from exc
        stand_in = ModuleType(spec.module)
        stand_in.__file__ = path

        # A notebook's cells (`nb.ipynb.py`) run from the notebook's folder, as Jupyter runs them.
        folder = os.path.dirname(path) if path.endswith(".ipynb.py") else None

        def run() -> None:
            module = ModuleType("__main__")
            module.__file__ = path
            previous, argv, cwd = sys.modules.get("__main__"), sys.argv, os.getcwd()
            sys.modules["__main__"], sys.argv = module, [path]  # its flags: their defaults
            try:
                if folder is not None:
                    os.chdir(folder)
                exec(code, module.__dict__)  # noqa: S102 - running the script is the point
            finally:
                os.chdir(cwd)
                self.restore("__main__", previous)
                sys.argv = argv

        return stand_in, run

    def explain(self, exc: BaseException) -> str:
        at = where(exc, self.root)
        return describe(exc) + (f" (at {at})" if at else "")

    def failure(self, stage: str, exc: BaseException) -> UserError:
        """Return the UserError of user code that raised `exc` at `stage`."""
        absent = exc.name if isinstance(exc, ModuleNotFoundError) else None
        return UserError(stage, self.explain(exc), absent.split(".")[0] if absent else None)

    def call(
        self,
        fn: Any,
        call: Any,
        request: Run,
        variant: str,
        probe: bool = False,
    ) -> tuple[Any, list[str]]:
        """Run one call under the request's mesh contexts; return the flattened output.

        With `probe`, the call is first traced with `jax.eval_shape`: a failure there is an
        input problem (stage "inputs"), not a failure of the code.
        """
        import jax

        from .contexts import bind, build_mesh, enter
        from .hostify import Unflattenable, flatten_output, from_host
        from .isolation import seed
        from .observe import observing
        from .outside import lay

        args, kwargs = from_host(call)
        meshes = [build_mesh(d) for d in request.meshes]
        with ExitStack() as stack:
            notes = []
            for ctx in request.contexts:
                namespace = self.context_namespace(ctx, request, variant)
                bound = bind(ctx.bindings, namespace)
                notes += [enter(stack, expr, namespace, meshes, bound) for expr in ctx.exprs]
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
                raise self.failure(stage, exc) from exc
            except BaseException as exc:  # sys.exit is not a shape problem
                raise self.failure("call", exc) from exc
        return flat, notes

    @contextmanager
    def showing(self, variant: str) -> Iterator[None]:
        """Keep what a unit call prints and writes in the tree (`shown`), then undo its writes."""
        from .shown import Shown, files_kept, placed, stdout_captured, the_programs

        self.unit_variants.append(variant)
        shown = Shown()
        self.shown.append(shown)
        with files_kept(self.root, self.pristine, read=True) as changes, stdout_captured() as out:
            yield
        # each side runs in its own copy: a path in it is printed as `<tree>` on both
        shown.printed = placed(the_programs(out), self.root)
        shown.files = {
            rel: ("text", placed(entry[1], self.root)) if entry[0] == "text" else entry
            for rel, entry in changes.files.items()
        }

    def with_steps(self, output: Any) -> Any:
        """Return a call's output, with the step calls it made when they are compared too."""
        if self.steps is None:
            return output
        return {"output": output, "step calls (flat layout)": list(self.steps)}

    def context_namespace(self, ctx: Context, request: Run, variant: str) -> dict[str, Any]:
        """Return the namespace in which a context's with-items are evaluated.

        Another file's module (often the script that ran the program) that cannot be executed
        here, and that the rewrite did not change, lends no names: the with-item's names are
        then bound to the mesh recorded at the call.
        """
        if ctx.module.file == request.target.file:
            return vars(self.target(request, variant)[0])
        try:
            return vars(self.load(ctx.module, variant))
        except BaseException as exc:
            if self.side == "original" or ctx.module.text is None:
                return {}
            raise self.failure("import", exc) from exc


def isolated(runner: Runner, request: R, handle: Callable[[Runner, R, Any], Reply]) -> Reply:
    """Run one request (`handle`) from the state a program starts in, and lay that state back.

    What the run cannot be undone of (`isolation.restore`) is reported as `restart`: the
    parent starts this worker again before the next request.
    """
    from .isolation import restore, snapshot
    from .shown import files_kept

    runner.pristine = request.pristine or None
    state = snapshot()
    try:
        with files_kept(runner.root, runner.pristine, read=False):
            reply = handle(runner, request, state)
    finally:
        why = restore(state, runner.root)
        runner.modules.clear()
    if why:
        print(f"jaxmigrate worker: starting again: {why}", file=sys.stderr)
        reply = dataclasses.replace(reply, restart=why)
    return reply
