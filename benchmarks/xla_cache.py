"""Verification with and without the workers' XLA compilation cache (`verify/xlacache.py`).

    python benchmarks/xla_cache.py [--rounds 3] [--jobs 2] [--fast-compile]

Copies the program-level pmap fixtures that have a `main()` (tests/fixtures/pmap/program_*.py,
every site verified through the program) into a temporary folder and runs, as a user does,
`jaxmigrate run --dry-run --no-cache --jobs J .` there on an 8-device CPU mesh, three ways,
in turn, ROUNDS times:
  1. off: `JAXMIGRATE_XLA_CACHE=0` (every program compiled every time it is traced);
  2. cold: an empty cache folder (what one run saves by itself);
  3. warm: the folder the cold run left (a dry run, then the real run).
It prints each way's median CPU seconds (user + system of the command and every process it
waited for: the workers compile) and wall seconds, the ratios to "off", the cache's size, and
checks that the three ways reported the same sites with the same statuses.

XLA's own flags are left as they are (`--fast-compile` adds the test suite's: optimisation level
0, without LLVM's expensive passes; compiles then cost less, and so does the cache's gain).
Nothing outside the temporary folder is written.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checkout import ROOT, require_checkout

FIXTURES = ROOT / "tests" / "fixtures" / "pmap"
FAST = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def programs() -> list[Path]:
    return sorted(
        p
        for p in FIXTURES.glob("program_*.py")
        if not p.name.endswith(".expected.py") and "def main(" in p.read_text()
    )


def run(
    tree: Path, jobs: int, cache: str, report: Path, env: dict[str, str]
) -> tuple[float, float]:
    """Run the dry run once; return its CPU seconds (itself and what it waited for) and wall."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    args = ["run", "--dry-run", "--no-cache", "--jobs", str(jobs), "--report", str(report), "."]
    done = subprocess.run(
        [sys.executable, "-m", "jaxmigrate", *args],
        cwd=tree,
        env={**env, "JAXMIGRATE_XLA_CACHE": cache},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"jaxmigrate exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def statuses(report: Path) -> list[tuple[str, int, str]]:
    files = json.loads(report.read_text())["files"]
    return sorted(
        (Path(f["path"]).name, s["line"], s["status"]) for f in files for s in f.get("sites", [])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--fast-compile", action="store_true")
    args = parser.parse_args()
    require_checkout()
    env = dict(os.environ)
    flags = [*env.get("XLA_FLAGS", "").split(), "--xla_force_host_platform_device_count=8"]
    if args.fast_compile:
        flags += FAST.split()
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    found = programs()
    figures: dict[str, list[tuple[float, float]]] = {"off": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="jaxmigrate-xla-bench-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        for path in found:
            shutil.copy(path, tree / path.name)
        cache = Path(tmp) / "xla"
        seen: dict[str, list[tuple[str, int, str]]] = {}
        for r in range(args.rounds):
            shutil.rmtree(cache, ignore_errors=True)
            for way, setting in (("off", "0"), ("cold", str(cache)), ("warm", str(cache))):
                report = Path(tmp) / f"{way}.json"
                figures[way].append(run(tree, args.jobs, setting, report, env))
                seen.setdefault(way, statuses(report))
                cpu, wall = figures[way][-1]
                print(f"round {r + 1} {way:<4}  cpu {cpu:7.1f} s  wall {wall:6.1f} s", flush=True)
        size = sum(p.stat().st_size for p in cache.iterdir() if p.is_file())
        entries = sum(1 for p in cache.iterdir() if p.is_file())
    if not (seen["off"] == seen["cold"] == seen["warm"]):
        sys.exit("the three ways reported different sites or statuses")
    sites = seen["off"]
    counts = {s: sum(1 for *_, t in sites if t == s) for s in sorted({t for *_, t in sites})}
    print(f"\n{len(found)} programs, {len(sites)} sites, the same statuses every way: {counts}")
    off = statistics.median(c for c, _ in figures["off"])
    for way, runs in figures.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"{way:<4}  median cpu {cpu:7.1f} s ({cpu / off:.2f}x off)  wall {wall:6.1f} s")
    print(f"cache: {entries} entries, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
