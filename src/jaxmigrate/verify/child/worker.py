"""A verification worker: one process, one side (original or candidate), many sites.

Started by the parent as `python -m _jaxmigrate_child.worker --side S --root R` with the
simulated-mesh environment, it limits its own address space, starts JAX once, says it is
`Ready`, then answers one request per line (`protocol`: typed, versioned records). The protocol
uses private duplicates of stdin/stdout: the user's code sees /dev/null as stdin and the
worker's log as stdout, so prints cannot corrupt it. Each kind of request has its handler:
`run-original` (`original`), `run-candidate` (`candidate`), `compare-records` (`records`). Any
exception from user code, `SystemExit` included, becomes a `Failed` reply; a request this
protocol version does not send is refused with the reason; a process forked by user code exits
before it can answer.
"""

from __future__ import annotations

import argparse
import os
import resource
import warnings
from collections.abc import Callable
from typing import IO, Any

from . import candidate, original, records
from .protocol import (
    CompareRecords,
    Exit,
    Failed,
    ProtocolError,
    Ready,
    Reply,
    Request,
    RunCandidate,
    RunOriginal,
    decode_request,
    encode,
)
from .runner import Runner, describe, isolated

Handler = Callable[[Runner, Any], Reply]
HANDLERS: dict[type, tuple[str, Handler]] = {  # kind -> (the side it runs on, its handler)
    RunOriginal: ("original", lambda runner, r: isolated(runner, r, original.handle)),
    RunCandidate: ("candidate", lambda runner, r: isolated(runner, r, candidate.handle)),
    CompareRecords: ("", records.handle),
}


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


def answer(runner: Runner, request: Request) -> Reply:
    """Return the reply of the request's handler (a worker bug is a reply too, not a hang)."""
    from .distributed import localize

    side, handler = HANDLERS[type(request)]
    if side and side != runner.side:
        error = f"a {request.KIND} request sent to the {runner.side} side's worker"
        return Failed(stage="protocol", error=error)
    try:
        return handler(runner, localize(request))
    except Exception as exc:  # noqa: BLE001 - a worker bug is a reply, not a hang
        return Failed(stage="worker", error=f"worker error: {describe(exc)}")


def serve(runner: Runner, inp: IO[str], out: IO[str]) -> None:
    """Answer requests until stdin closes; a forked copy of this process exits silently."""
    pid = os.getpid()
    for line in inp:
        try:
            request = decode_request(line)
        except ProtocolError as exc:
            out.write(encode(Failed(stage="protocol", error=f"this worker refused: {exc}")))
            continue
        if isinstance(request, Exit):
            break
        reply = answer(runner, request)
        if os.getpid() != pid:
            os._exit(0)
        out.write(encode(reply))


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

    from .compat import use_compilation_cache

    use_compilation_cache(os.environ)  # before the first compile
    ready = Ready(
        jax=jax.__version__,
        devices=len(jax.devices()),
        process=jax.process_index(),
        processes=jax.process_count(),
    )
    out.write(encode(ready))
    serve(Runner(args.side, os.path.realpath(args.root)), inp, out)


if __name__ == "__main__":
    main()
