"""Which lines of a rule the tests and real code bases run, and which `raise` lines none does.

    python benchmarks/rule_coverage.py [--rule pmap] [--tests FILE ...] [PATH ...]

Runs the rule's tests that need no JAX (`tests/test_fixtures.py tests/test_pmap_*.py -m "not
jax"` by default, in one process) and a dry run of the rule over each PATH (real code bases:
`/work/real/flax2023/examples` ...), all under coverage.py, and prints coverage's report for
`codemods/<rule>/`, then every `raise` no run reached: a skip or decline message no test pins
(each is a fixture to write, or a guard to delete). pytest-cov cannot measure this: the CLI's
file workers are forked processes, and the fixtures' runs are subprocesses; coverage.py's
`patch = subprocess` (7.10+) and `concurrency = multiprocessing` follow both.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = [
    "tests/test_fixtures.py",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/test_pmap_*.py")),
]

RC = """\
[run]
source = {source}
parallel = true
concurrency = thread,multiprocessing
patch = subprocess
data_file = {data}
"""


def unreached_raises(report: dict) -> list[str]:
    """Return `file:line: raise ...` for each `raise` statement among the missed lines."""
    found = []
    for name, data in sorted(report["files"].items()):
        missed = set(data["missing_lines"])
        source = Path(name).read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Raise) and node.lineno in missed:
                text = " ".join((ast.get_source_segment(source, node) or "").split())
                found.append((Path(name).name, node.lineno, text[:150]))
    return [f"{name}:{line}: {text}" for name, line, text in sorted(found)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="code bases to dry-run the rule over")
    parser.add_argument("--rule", default="pmap", help="the folder under codemods/ to measure")
    parser.add_argument("--tests", nargs="*", default=DEFAULT_TESTS, help="pytest files to run")
    args = parser.parse_args()
    source = ROOT / "codemods" / args.rule
    if not source.is_dir():
        parser.error(f"no rule folder {source}")
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such path: {missing[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        rc = Path(tmp) / "coveragerc"
        rc.write_text(RC.format(source=source, data=Path(tmp) / ".coverage"))
        run = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}"]
        tests = [*run, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        done = subprocess.run([*tests, *args.tests, "-m", "not jax"], check=False, cwd=ROOT)
        if done.returncode not in (0, 5):
            print(f"the tests failed (exit {done.returncode}): the figures below are partial")
        for path in args.paths:
            dry = ["-m", "jaxmigrate", "run", "--dry-run", "--no-verify", "--no-cache", "-j", "1"]
            subprocess.run(
                [*run, *dry, "--select", args.rule, "--target-jax", "0.8", str(path)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                check=False,
            )
        coverage = [sys.executable, "-m", "coverage"]
        subprocess.run([*coverage, "combine", f"--rcfile={rc}", "-q"], cwd=ROOT, check=True)
        subprocess.run([*coverage, "report", f"--rcfile={rc}"], cwd=ROOT, check=True)
        out = Path(tmp) / "coverage.json"
        subprocess.run(
            [*coverage, "json", f"--rcfile={rc}", "-q", "-o", str(out)], cwd=ROOT, check=True
        )
        raises = unreached_raises(json.loads(out.read_text()))
    print(f"\n{len(raises)} `raise` statements no run reached:")
    print("\n".join(raises))
    return 0


if __name__ == "__main__":
    sys.exit(main())
