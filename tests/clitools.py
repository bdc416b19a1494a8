"""Run jaxmigrate's command line as a user does: `python -m jaxmigrate ...` in a subprocess.

    from clitools import jm    # tests/ is on sys.path (tests/conftest.py)

    proc = jm("run", "--dry-run", ".", cwd=tree)
    assert proc.returncode == 0, proc.stderr

Every test that runs the CLI goes through here, so they all see the same terminal: plain text
(`NO_COLOR=1`) laid out `columns` wide (200 unless told, so a long message is one line), the
interpreter running the tests, and a timeout that fails a hung command instead of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

COLUMNS = 200
TIMEOUT = 300.0


def command(*args: str) -> list[str]:
    """The command line that runs `jaxmigrate ARGS` with the tests' interpreter."""
    return [sys.executable, "-m", "jaxmigrate", *args]


def cli_env(columns: int = COLUMNS, **extra: str) -> dict[str, str]:
    """This process's environment, plain text `columns` wide, with `extra` variables set."""
    return {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", **extra}


def jm(
    *args: str,
    cwd: str | Path,
    stdin: str | None = None,
    columns: int = COLUMNS,
    env: Mapping[str, str] | None = None,
    timeout: float | None = TIMEOUT,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """Run `jaxmigrate ARGS` in `cwd` and return what it did, whatever its exit code.

    `env` replaces the environment (`cli_env(...)` builds one); `kwargs` go to
    `subprocess.run` (e.g. `preexec_fn`)."""
    return subprocess.run(
        command(*args),
        cwd=cwd,
        capture_output=True,
        check=False,
        text=True,
        env=cli_env(columns) if env is None else dict(env),
        input=stdin,
        timeout=timeout,
        **kwargs,
    )


def git(root: Path, *args: str) -> None:
    """Run git in `root` as the tests' author (no global identity needed); raise if it fails."""
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def committed(root: Path) -> None:
    """Make `root` a git repository with everything in it committed (`run` writes only clean
    files)."""
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "pmap")


def run_with_report(
    root: Path, *args: str, timeout: float = 900
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run `jaxmigrate run ARGS --report ... --format json` in `root`, failing the test if it
    fails; return what it did and its JSON report (written beside `root`)."""
    import json

    report = root.parent / f"{root.name}-report.json"
    proc = jm("run", *args, "--report", str(report), "--format", "json", cwd=root, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(report.read_text())
