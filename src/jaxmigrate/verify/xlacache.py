"""XLA's persistent compilation cache for the verification workers, kept in jaxmigrate's cache.

Verification runs every program at least twice on each side (a probe, then the compared runs;
another key, another input), each run in a fresh trace, and a dry run followed by the real run
verifies everything again: the same programs reach XLA again and again. JAX's persistent
compilation cache answers a program it compiled before (same HLO, same options, same JAX) from
disk. The parent names the folder, `<jaxmigrate's cache>/xla`, in each worker's environment
(`ENV`); the worker turns the cache on there (`child.compat.use_compilation_cache`, after
`import jax`, before any compile) for every program however quick to compile. JAX before 0.5
is left as it is (its cache on CPU is younger than the programs it would serve).

Not in a job of several processes (`--processes N`, `pool.child_env`): under JAX 0.12.1 a
program with collectives across processes (gloo), loaded from the cache where an earlier job
wrote it, never completes (both processes wait in their first readback), so every 2-process
verification after the first timed out. Each such job compiles as it would without jaxmigrate.

Left alone: a user's own `JAX_COMPILATION_CACHE_DIR` (their cache, their settings).
`JAXMIGRATE_XLA_CACHE=0` turns it off; `JAXMIGRATE_XLA_CACHE=DIR` puts it in DIR (CI gives each
run an empty one, so a clean clone's time is measured from cold). JAX bounds its cache only
with the `filelock` package, which the user's interpreter may lack; the parent bounds it
instead (`prepare`, before the workers start): past `LIMIT` bytes, the entries written longest
ago go first. A damaged or half-written
entry is a miss: JAX compiles again and says so in a warning, which the workers do not show.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from jaxmigrate.verify.reference import cache_home

ENV = "JAXMIGRATE_XLA_CACHE"  # the folder; in the user's environment, "0" (or "off") turns it off
OFF = ("0", "off", "false", "no")
LIMIT = 1 << 30  # bytes
KEEP = 3 * LIMIT // 4  # what a trim leaves


def folder(env: Mapping[str, str] = os.environ) -> Path | None:
    """Return the cache folder the workers use (`JAXMIGRATE_XLA_CACHE` if it names one), or None:
    off (`JAXMIGRATE_XLA_CACHE=0`), or the user's own JAX cache."""
    value = env.get(ENV, "").strip()
    if env.get("JAX_COMPILATION_CACHE_DIR") or value.lower() in OFF:
        return None
    return Path(value).expanduser().absolute() if value else cache_home(env) / "xla"


def prepare(env: Mapping[str, str] = os.environ) -> Path | None:
    """Make the cache folder and trim it to `KEEP` bytes if it holds more than `LIMIT`; return it
    (None when off or when it cannot be made: verification then compiles as before)."""
    path = folder(env)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        trim(path)
    except OSError:
        return None
    return path


def trim(path: Path, limit: int = LIMIT, keep: int = KEEP) -> int:
    """Remove the entries written longest ago until `path` holds at most `keep` bytes, if it
    holds more than `limit`; return how many were removed. Another run's worker reading a
    removed entry keeps its open file; one looking it up later compiles again."""
    entries = []
    for entry in os.scandir(path):
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if entry.is_file(follow_symlinks=False):
            entries.append((info.st_mtime_ns, info.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    removed = 0
    for _, size, name in sorted(entries):
        if total <= keep:
            break
        try:
            os.unlink(name)
        except OSError:
            continue
        total -= size
        removed += 1
    return removed
