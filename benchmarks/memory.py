"""Memory peak of a `jaxmigrate --jobs N` run: all its processes together, not the largest one.

    python benchmarks/memory.py /path/to/jax-checkout [--jobs 2]

`throughput.py` reports the largest single process (getrusage's max RSS of the children); with
`--jobs 2` the parent and both workers are alive at once, so their sum is what the machine must
hold. This samples the resident and proportional set sizes (PSS counts pages the forked workers
share with the parent once) of every process of the run from /proc every 20 ms, on a private
copy of the tree, and prints the peaks of the sum next to the largest single process. Linux.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _checkout import require_checkout


def tree_of(root: int) -> list[int]:
    """Return `root` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def memory_kib(pid: int) -> tuple[int, int]:
    """Return (RSS, PSS) of one process in KiB; zeros once it is gone."""
    try:
        rollup = (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines()
    except OSError:
        return 0, 0
    values = {line.split(":")[0]: int(line.split()[1]) for line in rollup if line.endswith("kB")}
    return values.get("Rss", 0), values.get("Pss", 0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("tree", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    require_checkout()
    files = [p for p in args.tree.rglob("*.py") if p.is_file()]
    print(f"tree: {args.tree} ({len(files)} .py files), jobs={args.jobs}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(args.tree, copy, symlinks=True)
        cmd = [sys.executable, "-m", "jaxmigrate", "run", "--dry-run", "--no-verify"]
        cmd += ["--no-cache", f"--jobs={args.jobs}", "."]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=copy, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peak_rss = peak_pss = peak_one = most = 0
        while proc.poll() is None:
            pids = tree_of(proc.pid)
            sizes = [memory_kib(pid) for pid in pids]
            peak_rss = max(peak_rss, sum(r for r, _ in sizes))
            peak_pss = max(peak_pss, sum(p for _, p in sizes))
            peak_one = max([peak_one, *(r for r, _ in sizes)])
            most = max(most, sum(r > 0 for r, _ in sizes))
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        if proc.returncode not in (0, 1):
            sys.stderr.write(
                proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            )
    print(
        f"jaxmigrate run --dry-run --no-verify --jobs {args.jobs}: {elapsed:.1f} s, exit {proc.returncode}"
    )
    print(f"  processes at once        : {most}")
    print(f"  peak RSS, all processes  : {peak_rss / 1024:8.0f} MiB")
    print(f"  peak PSS, all processes  : {peak_pss / 1024:8.0f} MiB  (shared pages counted once)")
    print(f"  peak RSS, largest process: {peak_one / 1024:8.0f} MiB")


if __name__ == "__main__":
    main()
