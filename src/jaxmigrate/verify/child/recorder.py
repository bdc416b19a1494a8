"""Record the first few argument sets each target receives while the user's command runs.

Installed by the workspace's `sitecustomize` when `JAXMIGRATE_RECORD` names a plan (JSON):

    {"root": "/tmp/.../original", "out": "/tmp/.../records", "max_calls": 3,
     "spans": {"pkg/train.py": [[first_line, last_line, target_id], ...]},
     "functions": {"pkg.train": {"run": target_id}}}

An import hook patches the legacy entry points (`jax.pmap`, `jax.jit`, `jax.shard_map`,
`jax.experimental.pjit.pjit`, `jax.experimental.shard_map.shard_map`) once JAX is imported: a
call made directly from a line inside a span returns the usual function wrapped so that its
concrete calls are recorded, keyed by that span's target. The functions named in `functions`
(targets that enclose a site) are wrapped after their module is imported; when such a function
is a factory (it returns a jitted, pmapped or plain function), the function it returns is
wrapped too and its calls are recorded as `<target>.returned`. pjit accepts its removed
`in_axis_resources` / `out_axis_resources` keywords while recording (as the `pjit-in-shardings`
reference does), so a program the installed JAX can no longer run still yields inputs. Each record is a
pickle of the travelling arguments plus a JSON sidecar with the mesh contexts of the call: the
mesh-like `with` statements around the callers' lines, and the meshes active at the time.
Nothing here imports JAX before the program does.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.machinery
import io
import os
import pickle
import random
import sys
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from types import FrameType, FunctionType, GeneratorType, MethodType, ModuleType
from typing import Any

from .distributed import STDOUT, for_process, job, process_index
from .protocol import RecordedCall, encode
from .source import enclosing_withs

ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "jax": ("pmap", "jit", "shard_map"),
    "jax.experimental.pjit": ("pjit",),
    "jax.experimental.shard_map": ("shard_map",),
}


MAX_DEPTH = 8  # callers looked at in a deep file


@dataclass(frozen=True)
class Span:
    """Lines of one file whose legacy-API calls create the callable of target `target`."""

    file: str
    first: int
    last: int
    target: str


@dataclass(frozen=True)
class Kept:
    """The copies of a call's path arguments outside the tree, made just before it ran."""

    base: str
    entries: list[dict[str, Any]]


@dataclass
class Recorder:
    """Per-process recording state: what to record, where, and how many calls so far."""

    root: str
    out: str
    max_calls: int
    spans: dict[str, list[Span]]
    functions: dict[str, dict[str, str]]
    outputs: frozenset[str] = frozenset()  # targets whose outputs are recorded too (bound sites)
    deep: frozenset[str] = frozenset()  # files whose spans hold what their callers there create
    counts: dict[str, int] = field(default_factory=dict)
    pending: int = 0  # calls whose path arguments outside the tree were kept, so far
    reach: dict[str, list[list[int]]] = field(default_factory=dict)  # a function target's sites
    helpers: frozenset[str] = frozenset()  # files a rewrite wrote its helpers to (_pmap_compat.py)
    layouts: dict[str, dict[str, Any]] = field(default_factory=dict)  # steps kept flat (`flat`)
    trees: dict[str, tuple[ast.Module, str] | None] = field(default_factory=dict)
    proven: set[str] = field(default_factory=set)  # targets a call ran every site of (`ran`)
    tries: dict[str, int] = field(default_factory=dict)  # unrecorded calls watched (`unproven`)
    noted: set[str] = field(default_factory=set)  # targets a call of which missed (`missed`)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # Where a call comes from ------------------------------------------------------------------
    def relative(self, filename: str) -> str | None:
        path = os.path.realpath(filename or ".")
        if not path.startswith(self.root + os.sep):
            return None
        return os.path.relpath(path, self.root)

    def span_at(self, frame: FrameType) -> Span | None:
        """Return the span holding the line `frame` is executing, if any.

        In a `deep` file (a notebook's script) the callers in the same file are looked at too:
        the helper a rewrite defines in the notebook (`shard_map_per_device`) calls `jax.jit`
        for the site's statement, from its own lines.
        """
        rel = self.relative(frame.f_code.co_filename)
        found = self.span_in(rel, frame.f_lineno)
        caller, depth = frame.f_back, 0
        while found is None and rel in self.deep and caller is not None and depth < MAX_DEPTH:
            if self.relative(caller.f_code.co_filename) != rel:
                break
            found = self.span_in(rel, caller.f_lineno)
            caller, depth = caller.f_back, depth + 1
        # the rewrite's helper module (`_pmap_compat.shard_map_per_device`) calls `jax.jit` on
        # behalf of the site's statement: the first caller outside the helpers decides
        while found is None and rel in self.helpers and caller is not None and depth < MAX_DEPTH:
            rel = self.relative(caller.f_code.co_filename)
            found = self.span_in(rel, caller.f_lineno)
            caller, depth = caller.f_back, depth + 1
        return found

    def span_in(self, rel: str | None, line: int) -> Span | None:
        for span in self.spans.get(rel or "", ()):
            if span.first <= line <= span.last:
                return span
        return None

    def parsed(self, rel: str) -> tuple[ast.Module, str] | None:
        if rel not in self.trees:
            try:
                with open(os.path.join(self.root, rel), encoding="utf-8") as handle:
                    text = handle.read()
                self.trees[rel] = (ast.parse(text), text)
            except (OSError, SyntaxError, ValueError):
                self.trees[rel] = None
        return self.trees[rel]

    def context(self, frame: FrameType | None) -> tuple[list[list[Any]], list[list[Any]]]:
        """Return [file, line] of each mesh-like `with` around the callers, and of each caller
        in the tree (the line it was running), both outermost first."""
        withs_found: list[list[Any]] = []
        frames: list[list[Any]] = []
        while frame is not None:
            rel = self.relative(frame.f_code.co_filename)
            parsed = self.parsed(rel) if rel else None
            if parsed is not None and rel is not None:
                withs = enclosing_withs(parsed[0], parsed[1], frame.f_lineno)
                withs_found[:0] = [[rel, w.line] for w in withs]
                frames.insert(0, [rel, frame.f_lineno])
            frame = frame.f_back
        return withs_found, frames

    # Recording -----------------------------------------------------------------------------
    def ran(self, target: str, start: int | None) -> None:
        """Note that a call of `target` ran every one of its sites, seen by a line watch: a file
        `<target>.ran.p<process>`, once (`verify.recording.ran_targets`), holding how many bytes
        the process had printed when that call began (`stdout_offset`; empty if not known).
        Written for the calls that cannot be recorded too (an argument that does not pickle: a
        pmapped function)."""
        self.note_once("ran", self.proven, target, "" if start is None else str(start))

    def missed(self, target: str, missing: Any) -> None:
        """Note, once, that a call of `target` took another path than its sites (`missing`, the
        needs it did not run): a file `<target>.missed.p<process>` saying which, so that "the
        command made no call of it" can say why none was recorded."""
        from .reach import describe

        self.note_once("missed", self.noted, target, describe(missing))

    def note_once(self, kind: str, seen: set[str], target: str, text: str) -> None:
        """Write `text` to `<target>.<kind>.p<process>` unless `target` is in `seen` (read by
        `verify.recording.notes`)."""
        with self.lock:
            if target in seen:
                return
            seen.add(target)
        with open(os.path.join(self.out, f"{target}.{kind}.p{process_index()}"), "w") as handle:
            handle.write(text)

    def unproven(self, target: str) -> bool:
        """Return True if a call of `target` that cannot be recorded is to be watched: no call
        ran every site yet, and fewer than `max_calls` were watched so (each is traced)."""
        with self.lock:
            if target in self.proven or target not in self.reach:
                return False
            tries = self.tries.get(target, 0)
            self.tries[target] = tries + 1
            return tries < self.max_calls

    def wants(self, target: str) -> bool:
        with self.lock:
            return self.counts.get(target, 0) < self.max_calls

    def snapshot(self, target: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bytes | None:
        """Return the pickled travelling form of a call, or None if it cannot be recorded."""
        return self.pickled(self.hosted(target, args, kwargs))

    def hosted(self, target: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Return the travelling form of a call (arrays copied to the host), or None."""
        from .hostify import has_tracer, to_host

        if not self.wants(target) or has_tracer((args, kwargs)):
            return None
        layout = self.layouts.get(target)
        try:
            if layout is not None:
                return self.flat(layout, args, kwargs)
            return to_host((tuple(args), dict(kwargs)))
        except Exception:  # noqa: BLE001 - a value we cannot copy: this call is not recorded
            return None

    @staticmethod
    def flat(layout: dict[str, Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Return a call of the original's program-level step as the rewrite's step takes it:
        its arguments by position (`layouts.by_position`), its stacked values in the flat
        layout (`layouts.flatten`). A call passing other keywords stays as it is: its inputs
        will differ, and the site is not judged."""
        from .hostify import to_host
        from .layouts import by_position, differs, flatten

        passed = by_position(layout, tuple(args), kwargs)
        if passed is None:
            return to_host((tuple(args), dict(kwargs)))
        kinds = layout.get("args", [])
        # a stacked value flattened; the rest (keys, static arguments) as the rewrite's are kept.
        # An argument taken as replicated whose copies differ is kept stacked: the runs' inputs
        # then differ, and the site is not judged on a layout its program does not have.
        stacked = ("replicated", "batch")
        kinds = [
            "" if kind == "replicated" and i < len(passed) and differs(passed[i]) else kind
            for i, kind in enumerate(kinds)
        ]
        try:
            flat = tuple(
                flatten(a, kinds[i]) if i < len(kinds) and kinds[i] in stacked else to_host(a)
                for i, a in enumerate(passed)
            )
            return (flat, {})
        except Exception:  # noqa: BLE001 - not of the step's layout: not recorded
            return None

    def flat_output(self, target: str, out: Any) -> Any:
        """Return a step's output as the rewrite's step returns it (`layouts.flat_results`);
        stacked as it is when a result taken as replicated differs between devices, so that
        the comparison fails there."""
        from .layouts import differs, flat_results

        layout = self.layouts.get(target)
        if layout is None or isinstance(out, Raised):
            return out
        results = out if layout.get("tuple") and isinstance(out, tuple) else (out,)
        taken = [results[i] for i in layout.get("results", []) if i < len(results)]
        if any(differs(r) for r in taken):  # read as one value: the rewrite's has no devices
            return out
        try:
            return flat_results(layout, out)
        except Exception:  # noqa: BLE001 - not of the step's layout: compared as it is
            return out

    def pickled(self, tree: Any) -> bytes | None:
        """Return `tree` pickled, or None (an argument we cannot copy: the call is not
        recorded)."""
        from .pickling import dumps

        if tree is None:
            return None
        try:
            return dumps(tree)
        except Exception:  # noqa: BLE001 - an argument we cannot copy: this call is not recorded
            return None

    def keep_outside(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Kept | None:
        """Copy the call's path arguments outside the tree as they are now (`outside`)."""
        from .outside import keep, outside_arguments

        found = outside_arguments(args, kwargs, [self.root, os.path.dirname(self.out)])
        if not found:
            return None
        with self.lock:
            self.pending += 1
            base = os.path.join(self.out, f"pending-{os.getpid()}-{self.pending}")
        return Kept(base, keep(found, base))

    def save(
        self,
        target: str,
        payload: bytes,
        caller: FrameType | None,
        out: Any = None,
        kept: Kept | None = None,
    ) -> None:
        """Write one recorded call and its context, if the target still wants calls.

        For targets in `outputs`, the call's output is written too (flattened, on the host).
        The copies `kept` of its path arguments outside the tree go with it.
        """
        from .contexts import active_meshes
        from .hostify import flatten_output, shapes
        from .outside import discard, rename

        with self.lock:
            n = self.counts.get(target, 0)
            if n >= self.max_calls:
                if kept is not None:
                    discard(kept.entries, kept.base)
                return
            self.counts[target] = n + 1
        base = os.path.join(self.out, f"{target}-{os.getpid()}-{n}")
        if job() is not None:  # process i of a job: its n-th call pairs with the others' n-th
            base = for_process(os.path.join(self.out, f"{target}-{n}.pkl"))[: -len(".pkl")]
        if kept is not None:
            rename(kept.entries, kept.base, base)
        with open(base + ".pkl", "wb") as handle:
            handle.write(payload)
        if target in self.outputs:
            out = self.flat_output(target, out)
            try:
                flat = pickle.dumps(out.flat() if isinstance(out, Raised) else flatten_output(out))
            except Exception:  # noqa: BLE001 - an output we cannot copy: compared as missing
                flat = None
            if flat is not None:
                with open(base + ".out.pkl", "wb") as handle:
                    handle.write(flat)
        contexts, frames = self.context(caller)
        meta = RecordedCall(
            target=target,
            contexts=contexts,
            frames=frames,
            meshes=active_meshes(),
            shapes=shapes(pickle.loads(payload)),
            process=process_index(),
            # where the command imported the tree from (pytest adds test folders): the workers
            # add the same folders, so what was pickled by name can be found
            paths=sorted({rel for rel in map(self.relative, sys.path[:50]) if rel}),
            outside=kept.entries if kept is not None else [],
        )
        with open(base + ".json", "w", encoding="utf-8") as handle:
            handle.write(encode(meta))

    # Patching ------------------------------------------------------------------------------
    def entry(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """Return `real` (a legacy entry point) recording what it creates from a span."""

        @functools.wraps(real)
        def entry(*args: Any, **kwargs: Any) -> Any:
            span = self.span_at(sys._getframe(1))
            result = real(*args, **kwargs)
            if span is None or not callable(result):
                return result
            if not args and not ({"f", "fun", "fn"} & set(kwargs)):
                return lambda fun: Recording(result(fun), span.target, self)
            return Recording(result, span.target, self)

        return entry

    def patch_jax(self, module: ModuleType) -> None:
        for name in ENTRY_POINTS[module.__name__]:
            if hasattr(module, name):
                real = getattr(module, name)
                if module.__name__ == "jax.experimental.pjit":
                    from .references import with_in_shardings

                    real = functools.wraps(real)(with_in_shardings(real))
                setattr(module, name, self.entry(real))

    def patch_functions(self, module: ModuleType) -> None:
        """Wrap the module's function targets, and the methods watched for a group's edits
        (`Class.method`, only watched: a call of a method is not recorded)."""
        for qualname, target in self.functions[module.__name__].items():
            owner_name, _, name = qualname.rpartition(".")
            owner = getattr(module, owner_name, None) if owner_name else module
            if owner_name and not isinstance(owner, type):
                continue
            # a class's own method, not one it inherits (`vars`): the site is in its body
            fn = vars(owner).get(name) if owner_name else getattr(module, name, None)
            usable = isinstance(fn, FunctionType) if owner_name else callable(fn)
            if usable and fn is not None and not isinstance(fn, Recording):
                wrapped = Recording(fn, target, self, factory=not owner_name)
                wrapped.watch_only = bool(owner_name)
                setattr(owner, name, wrapped)


PENDING = b""  # a call's record not pickled yet: its iterator arguments are being drawn
MAX_DRAWN = 256  # items of one iterator argument a record keeps (a longer stream: not recorded)


class Drawing:
    """An iterator argument of a recorded call, passing its items through and keeping each, as
    it travels, for the record (pickled as `HostDrawn`: a replay draws the same items)."""

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it
        self.items: list[Any] = []
        self.kept = True  # False: too many items, or one that cannot travel

    def __iter__(self) -> Drawing:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        if self.kept and len(self.items) < MAX_DRAWN:
            from .hostify import has_tracer, to_host

            self.items.append(to_host(item))
            self.kept = not has_tracer(item)
        else:
            self.kept = False
        return item

    def __getattr__(self, name: str) -> Any:  # `send`, `close`: the iterator's own
        return getattr(self._it, name)

    def __reduce__(self) -> tuple[Any, ...]:
        from .values import HostDrawn

        return HostDrawn, (tuple(self.items),)


def drawn_from(
    args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[Drawing]]:
    """Return the arguments with each iterator among them (a generator, `map`, `zip`, a data
    pipeline's iterator; not a file) wrapped in a Drawing, and the Drawings."""
    drawing: list[Drawing] = []

    def wrapped(x: Any) -> Any:
        if isinstance(x, Iterator) and not isinstance(x, io.IOBase):
            drawing.append(Drawing(x))
            return drawing[-1]
        return x

    new_args = tuple(wrapped(a) for a in args)
    return new_args, {k: wrapped(v) for k, v in kwargs.items()}, drawing


def function_like(x: Any) -> bool:
    """Return True for what a factory returns: a plain, partial, jitted or pmapped function."""
    return isinstance(x, (FunctionType, functools.partial)) or (
        callable(x) and hasattr(x, "__wrapped__") and not isinstance(x, type)
    )


def stdout_offset() -> int | None:
    """Return how many bytes this process has written to its standard output so far, when that
    is the file jaxmigrate gave the command (`distributed.STDOUT`; not a pipe, nor a file a test
    runner's capture put there); else None."""
    expected = os.environ.get(STDOUT)
    if not expected:
        return None
    try:
        sys.stdout.flush()
        held, ours = os.fstat(1), os.stat(expected)
        if (held.st_dev, held.st_ino) != (ours.st_dev, ours.st_ino):
            return None
        return os.lseek(1, 0, os.SEEK_CUR)
    except (OSError, ValueError, AttributeError):
        return None


class Raised:
    """A recorded call that raised: compared by the exception's type only."""

    def __init__(self, exc: BaseException) -> None:
        kind = type(exc)
        self.name = f"{kind.__module__}.{kind.__qualname__}"

    def flat(self) -> Any:
        from .values import Flat

        return Flat("raised", (("", f"raised {self.name}"),))


class Recording:
    """A callable that records its first concrete calls for `target`, then behaves as `fn`."""

    watch_only = False  # a method holding a group's edits: its calls are watched, not recorded

    def __init__(
        self, fn: Callable[..., Any], target: str, recorder: Recorder, factory: bool = False
    ) -> None:
        functools.update_wrapper(self, fn, updated=())
        self._fn = fn
        self._target = target
        self._recorder = recorder
        self._factory = factory

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        drawing: list[Drawing] = []
        if self._recorder.wants(self._target) and not self.watch_only:  # what the call draws
            args, kwargs, drawing = drawn_from(args, kwargs)
        tree = None if self.watch_only else self._recorder.hosted(self._target, args, kwargs)
        # with iterators, pickled once the call has drawn from them (`PENDING` until then)
        payload = self._recorder.pickled(tree) if not drawing else PENDING if tree else None
        kept = self._recorder.keep_outside(args, kwargs) if payload is not None else None
        # a call that cannot be recorded is watched too, until one ran every site (`ran`)
        proven = self._target in self._recorder.proven
        watched = payload is not None or self._recorder.unproven(self._target)
        watch = self.watch() if watched else None
        start = stdout_offset() if watch is not None and not proven else None
        try:
            with watch if watch is not None else nullcontext():
                out = self._fn(*args, **kwargs)
            if watch is not None and watch.missing and isinstance(out, GeneratorType):
                # a generator's body runs as it is iterated: its lines are watched then, and
                # judged when it ends; the call itself returned no value to record
                out = watching(out, watch, functools.partial(self.settle, watch, start, proven))
                payload = None
            elif watch is not None:
                self.settle(watch, start, proven)
            if watch is not None and watch.missing:  # another path: the call shows nothing
                payload = None
            if payload is None and kept is not None:
                from .outside import discard

                discard(kept.entries, kept.base)
                kept = None
        except BaseException as exc:
            if payload is PENDING:
                payload = self._recorder.pickled(tree) if all(d.kept for d in drawing) else None
            # For a bound site, raising (what a test may expect) is the call's outcome too.
            if payload is not None and self._target in self._recorder.outputs:
                self._recorder.save(self._target, payload, sys._getframe(1), Raised(exc), kept)
            elif kept is not None:
                from .outside import discard

                discard(kept.entries, kept.base)
            raise
        if payload is PENDING:
            payload = self._recorder.pickled(tree) if all(d.kept for d in drawing) else None
            if payload is None and kept is not None:
                from .outside import discard

                discard(kept.entries, kept.base)
        if payload is not None:
            self._recorder.save(self._target, payload, sys._getframe(1), out, kept)
        if self._factory and function_like(out):
            return Recording(out, f"{self._target}.returned", self._recorder)
        return out

    def settle(self, watch: Any, start: int | None, proven: bool) -> None:
        """Note what a watched call ran: every site (`ran`), or another path (`missed`)."""
        if watch.watched and not watch.missing and not proven:
            self._recorder.ran(self._target, start)
        if watch.missing:
            self._recorder.missed(self._target, watch.missing)

    def watch(self) -> Any:
        """Return a Watch over the sites of a function target, so that only calls that run
        them are recorded (`reach`); None for other targets."""
        from .reach import Watch, spans_of

        spans = self._recorder.reach.get(self._target)
        code = getattr(self._fn, "__code__", None)
        if not spans or code is None:
            return None
        return Watch(code.co_filename, spans_of(spans))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else MethodType(self, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


def watching(gen: Generator[Any, Any, Any], watch: Any, settle: Callable[[], None]) -> Any:
    """Return a generator that runs `gen` under `watch` each time it is resumed (`next`,
    `send`, `throw`), passing every value both ways, and calls `settle` when it ends: exhausted,
    raising, closed, or dropped."""

    def run() -> Generator[Any, Any, Any]:
        resume: Callable[[Any], Any] = gen.send
        value: Any = None
        try:
            while True:
                try:
                    with watch:
                        item = resume(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    value, resume = (yield item), gen.send
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as exc:  # noqa: BLE001 - thrown in: `gen`'s to handle
                    value, resume = exc, gen.throw
        finally:
            settle()

    return run()


class _After(importlib.abc.Loader):
    """A loader that runs `then(module)` after the real loader executed the module."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class Hook(importlib.abc.MetaPathFinder):
    """Finds modules with the other finders and wraps their loader to patch them when run."""

    def __init__(self, after: dict[str, Callable[[ModuleType], None]]) -> None:
        self.after = after

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.after:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _After(spec.loader, self.after[name])
                return spec
        return None


def seed_numpy(module: ModuleType) -> None:
    """Seed numpy's global generator once `numpy.random` is imported."""
    module.seed(0)


def seed_tensorflow(module: ModuleType) -> None:
    """Seed TensorFlow's global generator once it is imported: its shuffles and random ops draw
    alike on both trees (not always: a parallel `map` may order their draws differently, and
    the runs then diverge, and say so; making ops deterministic breaks ops like
    `sample_distorted_bounding_box`, so it is left to the command)."""
    set_seed = getattr(getattr(module, "random", None), "set_seed", None)
    if callable(set_seed):
        set_seed(0)


def load_plan(path: str) -> Recorder:
    """Return the recorder a plan file describes (`protocol.RecordPlan`)."""
    from .protocol import decode_plan

    with open(path, encoding="utf-8") as handle:
        plan = decode_plan(handle.read())
    spans = {
        rel: [Span(rel, first, last, target) for first, last, target in items]
        for rel, items in plan.spans.items()
    }
    root = os.path.realpath(plan.root)
    outputs, deep = frozenset(plan.outputs), frozenset(plan.deep)
    recorder = Recorder(root, plan.out, plan.max_calls, spans, plan.functions, outputs, deep)
    recorder.reach = dict(plan.reach)
    recorder.helpers = frozenset(plan.helpers)
    recorder.layouts = dict(plan.layouts)
    return recorder


def install(plan_path: str) -> Recorder:
    """Install the import hook for the plan at `plan_path`; return the recorder."""
    recorder = load_plan(plan_path)
    after: dict[str, Callable[[ModuleType], None]] = dict.fromkeys(ENTRY_POINTS, recorder.patch_jax)
    after.update(dict.fromkeys(recorder.functions, recorder.patch_functions))
    # The command runs on both trees for sites only it reaches: the same seeds make unseeded
    # test data (`np.random.rand`) the same in both runs, so their calls can be compared.
    random.seed(0)
    after["numpy.random"] = seed_numpy
    after["tensorflow"] = seed_tensorflow
    sys.meta_path.insert(0, Hook(after))
    return recorder
