"""Join an N-process JAX job, when the parent started this process as one of its processes.

The parent (`jaxmigrate.verify.processes`) sets JAXMIGRATE_PROCESS_ID, JAXMIGRATE_NUM_PROCESSES
and JAXMIGRATE_COORDINATOR. `join()` then selects gloo CPU collectives and calls
`jax.distributed.initialize` before any other JAX use, and turns the program's own later calls of
`jax.distributed.initialize` into no-ops: the job is already formed, whatever addresses the
program would have passed. Workers call `join()` at start-up; for the recorded command the
bootstrap calls `install()`, which joins when the program first imports JAX (never earlier).

Per-process files follow one convention: process `i` of a job reads and writes `name.p<i>.pkl`
where a one-process run uses `name.pkl`; `for_process` maps one to the other.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from .protocol import Message, Run, RunOriginal

PROCESS_ID = "JAXMIGRATE_PROCESS_ID"
NUM_PROCESSES = "JAXMIGRATE_NUM_PROCESSES"
COORDINATOR = "JAXMIGRATE_COORDINATOR"


RECORD = "JAXMIGRATE_RECORD"
STDOUT = "JAXMIGRATE_STDOUT"  # the file a recorded command's process prints to (`stdout_offset`)
R = TypeVar("R", bound=Message)
_job: list[tuple[int, int, str] | None] = []  # this process's job, read from the environment once


def job() -> tuple[int, int, str] | None:
    """Return (process index, process count, coordinator) of this process's job, or None."""
    if not _job:
        env = os.environ
        found = None
        if env.get(COORDINATOR):
            found = (int(env[PROCESS_ID]), int(env[NUM_PROCESSES]), env[COORDINATOR])
        _job.append(found)
    return _job[0]


def detach() -> None:
    """Keep the job to this process: the processes it starts neither join it nor record.

    A program that starts Python subprocesses (a launcher, a data loader, a test spawning a
    script) would otherwise have each of them join the job as process i, a second process i
    that the coordinator refuses or that blocks the job; and what they recorded would pass for
    process i's own calls. They run as ordinary single processes on this process's devices.
    """
    job()  # read before the variables go
    for name in (PROCESS_ID, NUM_PROCESSES, COORDINATOR, RECORD):
        os.environ.pop(name, None)


def process_index() -> int:
    """Return this process's index in its job (0 outside a job)."""
    found = job()
    return found[0] if found else 0


def join() -> None:
    """Join the job the environment names (nothing outside a job); then import-safe no-ops."""
    found = job()
    if found is None:
        return
    detach()
    index, count, coordinator = found
    import jax
    import jax.distributed

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=count, process_id=index)
    jax.distributed.initialize = formed  # type: ignore[assignment]
    sys.excepthook = exit_at_once(sys.excepthook)


def formed(*args: Any, **kwargs: Any) -> None:
    """The job is formed by jaxmigrate already; the program's own call does nothing."""


def alone() -> None:
    """Make a worker outside a job a job of one process, formed before the program runs.

    A worker starts JAX before it runs any program, so a program's own first line,
    `jax.distributed.initialize()`, would raise "must be called before any JAX calls" there
    (and the original would seem unable to run): as in a job, the program's call does nothing,
    and the program runs as process 0 of 1 (`--processes N` runs it as N).
    """
    if job() is not None:
        return
    import jax.distributed

    jax.distributed.initialize = formed  # type: ignore[assignment]


def exit_at_once(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Return an excepthook that reports, then exits without waiting for the job's peers.

    A normal exit waits in `jax.distributed.shutdown` for every other process of the job; a
    process that died of an exception would wait there for peers that may wait for it.
    """

    def excepthook(*args: Any) -> None:
        hook(*args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    return excepthook


def for_process(path: str) -> str:
    """Return process i's file for `path` (`x.pkl` -> `x.p<i>.pkl`; unchanged outside a job)."""
    found = job()
    if found is None or not path:
        return path
    stem, dot, ext = path.rpartition(".")
    if not dot:
        return f"{path}.p{found[0]}"
    for i in range(found[1]):  # a recorded file may already name process 0's copy
        if stem.endswith(f".p{i}"):
            stem = stem[: -len(f".p{i}")]
            break
    return f"{stem}.p{found[0]}.{ext}"


class _JoinHook(importlib.abc.MetaPathFinder):
    """Joins the job right after `jax` is first imported (chains with the recorder's hook)."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then
        self.busy = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "jax" or getattr(self.busy, "on", False):
            return None
        self.busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        finally:
            self.busy.on = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Then(spec.loader, self.then)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def install() -> None:
    """Join the job when the program imports JAX (now, if it already has)."""
    if job() is None:
        return
    detach()
    if "jax" in sys.modules:
        join()
    else:
        sys.meta_path.insert(0, _JoinHook(join))


def localize(request: R) -> R:
    """Return `request` as process i of a job runs it: its own files, devices and data seed."""
    if job() is None or not isinstance(request, Run):
        return request
    import jax

    out = dataclasses.replace(
        request,
        inputs_path=for_process(request.inputs_path),
        outputs_path=for_process(request.outputs_path),
    )
    if isinstance(out, RunOriginal):
        spec = dataclasses.replace(
            out.inputs,
            recorded=[for_process(p) for p in out.inputs.recorded],
            devices=jax.local_device_count(),
            seed=jax.process_index(),
        )
        out = dataclasses.replace(out, inputs=spec)
    return out
