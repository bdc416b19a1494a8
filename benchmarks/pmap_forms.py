"""Which form each pmap site of real code bases takes: program-level, faithful, or declined.

    python benchmarks/pmap_forms.py NAME=PATH[+CONFIG.toml] [...] [--json out.json] [--target-jax X.Y]

Each PATH (a checkout of a code base at a commit before its own engineers migrated off pmap:
`git --git-dir=<mirror> archive <commit> | tar -x -C /work/real/<name>`) is run through
`jaxmigrate run --dry-run --no-verify --no-cache --select pmap --format json` (nothing is
written, nothing executed). A pmap site is a site whose message begins "`jax.pmap` ->" (not the
edits grouped with it: replications, readbacks, the mesh), or a skip of the pmap rule. Printed
per code base: sites, program-level, faithful, declined (skipped), and the reasons the
program-level form was not taken, most frequent first (the decline code when the message has
one, `[PL123]`, else the reason's text). `--target-jax 0.7` measures a code base whose own pin
(brax's `jax>=0.4.6`) predates `jax.shard_map`, as its maintainers would after raising the pin;
without it such sites are all "skipped: the rewrite needs JAX >= 0.7". `PATH+CONFIG.toml`
measures the code base as its maintainers would configure it: a copy of PATH whose
`pyproject.toml` ends with CONFIG's text (a `[tool.jaxmigrate]` table: `pmap-replicated`,
`closed-code-base`; `benchmarks/real_code/big_vision.toml`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _checkout import require_checkout

PMAP_SITE = "`jax.pmap` ->"
PROGRAM = "(program-level)"
NOT_TAKEN = re.compile(r"program-level form not taken: (.*?)(?:; the helper |$)")
CODE = re.compile(r"\[(PL\d{3})\]")


def report_of(path: Path, target_jax: str | None = None) -> dict:
    """Return the JSON report of a dry run of the pmap rule over `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-m",
            "jaxmigrate",
            "run",
            "--dry-run",
            "--no-verify",
            "--no-cache",
            "--select",
            "pmap",
            "--report",
            str(out),
            "--format",
            "json",
            str(path),
        ]
        if target_jax is not None:
            command[-1:-1] = ["--target-jax", target_jax]
        subprocess.run(command, capture_output=True, check=False)
        return json.loads(out.read_text())


def reason_of(message: str) -> str | None:
    """Return the decline code (or text) of a faithful site's message, None if none is given."""
    found = NOT_TAKEN.search(message)
    if found is None:
        return None
    reason = found.group(1)
    code = CODE.search(reason)
    return code.group(1) if code else reason.split(":")[0][:90]


def count(report: dict) -> dict:
    """Return the counts of one code base's report."""
    rows: dict = {"sites": 0, "program-level": 0, "faithful": 0, "declined": 0}
    reasons: collections.Counter[str] = collections.Counter()
    for file in report["files"]:
        for site in file.get("sites", []):
            if site.get("name") != "pmap" or not site["message"].startswith(PMAP_SITE):
                continue
            rows["sites"] += 1
            if PROGRAM in site["message"]:
                rows["program-level"] += 1
                continue
            rows["faithful"] += 1
            reason = reason_of(site["message"])
            if reason is not None:
                reasons[reason] += 1
        for skip in file.get("skips", []):
            if skip.get("name") == "pmap" or skip.get("code") == "JM202":
                rows["sites"] += 1
                rows["declined"] += 1
                reasons["skipped: " + skip.get("reason", skip.get("message", ""))[:80]] += 1
    rows["reasons"] = reasons.most_common()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bases", nargs="+", help="NAME=PATH")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    parser.add_argument("--top", type=int, default=5, help="reasons shown per code base")
    parser.add_argument("--target-jax", help="oldest JAX the output must run on (default: the pin)")
    args = parser.parse_args()
    require_checkout()
    table = {}
    for base in args.bases:
        name, _, where = base.partition("=")
        path, _, config = where.partition("+")
        if not config:
            table[name] = count(report_of(Path(path), args.target_jax))
            continue
        with tempfile.TemporaryDirectory() as tmp:  # the code base, configured
            copy = Path(tmp) / Path(path).name
            shutil.copytree(path, copy, symlinks=True)
            pyproject = copy / "pyproject.toml"
            before = pyproject.read_text() if pyproject.is_file() else ""
            pyproject.write_text(before + "\n" + Path(config).read_text())
            table[name] = count(report_of(copy, args.target_jax))
    print("| code base | pmap sites | program-level | faithful | declined | top reasons |")
    print("|---|---|---|---|---|---|")
    for name, rows in table.items():
        top = "; ".join(f"{r} ({n})" for r, n in rows["reasons"][: args.top])
        print(
            f"| {name} | {rows['sites']} | {rows['program-level']} | {rows['faithful']} | "
            f"{rows['declined']} | {top} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
