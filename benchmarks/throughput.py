"""Scan/rewrite throughput on a large real tree, side by side with libcst's NOOP codemod.

    python benchmarks/throughput.py /path/to/jax-checkout [--jobs 2]

Runs, on private copies of the tree, in one session:
  1. `python -m libcst.tool codemod noop.NOOPCommand --no-format --jobs=N`  (parses every file)
  2. `jaxmigrate run --dry-run --no-verify --jobs N`                         (what users run)
and prints wall time, files, lines, the ratio, and jaxmigrate's peak memory (max RSS of its
processes). Nothing in the given tree is written.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str], cwd: Path) -> tuple[float, int, int]:
    """Return wall seconds, exit code and the peak RSS (KiB) of the command's processes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr.decode(errors="replace")[-2000:])
    return elapsed, proc.returncode, max(peak, before)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("tree", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    files = [p for p in args.tree.rglob("*.py") if p.is_file()]
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    print(f"tree: {args.tree} ({len(files)} .py files, {lines} lines), jobs={args.jobs}")
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = Path(tmp) / "jaxmigrate", Path(tmp) / "libcst"
        shutil.copytree(args.tree, ours, symlinks=True)
        shutil.copytree(args.tree, theirs, symlinks=True)
        jm = [
            sys.executable,
            "-m",
            "jaxmigrate",
            "run",
            "--dry-run",
            "--no-verify",
            f"--jobs={args.jobs}",
            ".",
        ]
        noop = [
            sys.executable,
            "-m",
            "libcst.tool",
            "codemod",
            "noop.NOOPCommand",
            "--no-format",
            f"--jobs={args.jobs}",
            ".",
        ]
        t_jm, rc_jm, rss = timed(jm, ours)
        t_noop, rc_noop, _ = timed(noop, theirs)
    print(
        f"jaxmigrate run --dry-run --no-verify : {t_jm:8.2f} s  (exit {rc_jm}, peak RSS {rss / 1024:.0f} MiB)"
    )
    print(f"libcst NOOP codemod                  : {t_noop:8.2f} s  (exit {rc_noop})")
    print(f"ratio (libcst NOOP / jaxmigrate)     : {t_noop / t_jm:8.2f}x")


if __name__ == "__main__":
    main()
