"""Scan throughput on a large real tree, against libcst's NOOP codemod over the same files.

    python benchmarks/throughput.py /path/to/jax-checkout [--jobs 2] [--rounds 3]

Runs, on private copies of the tree (nothing in the given tree is written), in alternated
rounds (jaxmigrate, libcst, jaxmigrate, libcst, ...):
  1. `jaxmigrate run --dry-run --no-verify --no-cache --jobs N`     (what users run, cold)
  2. `python -m libcst.tool codemod noop.NOOPCommand --no-format --jobs=N`  (parses every file)

For each run it reads from the operating system the CPU time (user + system) of the command
and all its worker processes (`RUSAGE_CHILDREN`), and the wall time. The ratio printed is
libcst's median CPU time over jaxmigrate's: on a shared machine CPU time barely moves with the
load while wall time does, and alternating the two puts any drift of the machine on both sides.
The wall-time ratio of the medians is printed too; on a quiet machine the two agree, as both
commands use the same number of worker processes. `--no-cache`: a cache (the user's cache
directory for dry runs) would answer the second round from the first.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checkout import require_checkout


def timed(cmd: list[str], cwd: Path) -> tuple[float, float, int, int]:
    """Return the CPU seconds (user + system, workers included), wall seconds, exit code and
    peak RSS (KiB, the largest process) of one run of `cmd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr.decode(errors="replace")[-2000:])
    return cpu, wall, proc.returncode, after.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("tree", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_checkout()
    files = [p for p in args.tree.rglob("*.py") if p.is_file()]
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    print(f"tree: {args.tree} ({len(files)} .py files, {lines} lines), jobs={args.jobs}")
    jm = [sys.executable, "-m", "jaxmigrate", "run", "--dry-run", "--no-verify", "--no-cache"]
    jm += [f"--jobs={args.jobs}", "."]
    noop = [sys.executable, "-m", "libcst.tool", "codemod", "noop.NOOPCommand", "--no-format"]
    noop += [f"--jobs={args.jobs}", "."]
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    rss = 0
    with tempfile.TemporaryDirectory() as tmp:
        mine, copy = Path(tmp) / "jaxmigrate", Path(tmp) / "libcst"
        shutil.copytree(args.tree, mine, symlinks=True)
        shutil.copytree(args.tree, copy, symlinks=True)
        for n in range(args.rounds):
            cpu, wall, rc, peak = timed(jm, mine)
            ours.append((cpu, wall))
            rss = peak if n == 0 else rss  # later, libcst's processes count too
            print(f"round {n + 1}: jaxmigrate {cpu:7.2f} s CPU {wall:7.2f} s wall (exit {rc})")
            cpu, wall, rc, _ = timed(noop, copy)
            theirs.append((cpu, wall))
            print(f"round {n + 1}: libcst NOOP {cpu:7.2f} s CPU {wall:7.2f} s wall (exit {rc})")
    cpu_jm, wall_jm = (statistics.median(x) for x in zip(*ours, strict=True))
    cpu_noop, wall_noop = (statistics.median(x) for x in zip(*theirs, strict=True))
    print(
        f"jaxmigrate run --dry-run --no-verify : {cpu_jm:8.2f} s CPU {wall_jm:8.2f} s wall"
        f" (medians; peak RSS {rss / 1024:.0f} MiB, its largest process)"
    )
    print(f"libcst NOOP codemod                  : {cpu_noop:8.2f} s CPU {wall_noop:8.2f} s wall")
    print(f"ratio (libcst NOOP / jaxmigrate)     : {cpu_noop / cpu_jm:8.2f}x CPU")
    print(f"                                       {wall_noop / wall_jm:8.2f}x wall")


if __name__ == "__main__":
    main()
