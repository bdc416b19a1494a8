"""Run the user's `--verify-with` command on the original copy and collect the recorded calls.

The command runs in a shell in the original copy, with the recorder's bootstrap first on
`PYTHONPATH` and a plan naming what to record: for each callable target the lines (`span`) whose
legacy-API calls create it, for each function target its module and name. The parent reads only
the JSON sidecars; the pickled arguments are opened by the workers.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.planner import Plan
from jaxmigrate.verify.pool import child_env, kill_group
from jaxmigrate.verify.targets import Kind
from jaxmigrate.verify.workspace import Workspace

RETURNED = ".returned"  # the recorder's suffix for the calls of a factory's returned function


@dataclass(frozen=True)
class Recorded:
    """The calls recorded for one target: pickles for the workers, and the first call's context."""

    files: tuple[str, ...]
    contexts: tuple[tuple[str, int], ...]
    meshes: tuple[dict[str, Any], ...]
    shapes: tuple[str, ...]
    returned: Recorded | None = None  # the calls of the function the target returned


@dataclass(frozen=True)
class Recording:
    """What the command left: the calls per plan id, and how the command ended."""

    calls: dict[str, Recorded] = field(default_factory=dict)
    note: str = ""
    error: str = ""  # how the command failed, with the last lines of its output; '' if it did not


def recording_plan(plans: Sequence[Plan], ws: Workspace, max_calls: int) -> dict[str, Any]:
    """Return the recorder's plan: spans for callable targets, functions for the rest."""
    spans: dict[str, list[list[Any]]] = defaultdict(list)
    functions: dict[str, dict[str, str]] = defaultdict(dict)
    for plan in plans:
        target = plan.target
        if target.kind is Kind.CALLABLE:
            spans[plan.path].append([target.first, target.last, plan.id])
        if "." not in target.qualname:
            functions[plan.module].setdefault(target.qualname, plan.id)
    return {
        "root": str(ws.original),
        "out": str(ws.records),
        "max_calls": max_calls,
        "spans": spans,
        "functions": functions,
    }


def run_command(command: str, ws: Workspace, config: VerifyConfig, plan_file: Path) -> str:
    """Run the command on the original copy; return a note if it did not end cleanly."""
    env = child_env(config, ws, extra_path=(ws.boot,))
    env["JAXMIGRATE_RECORD"] = str(plan_file)
    log = ws.logs / "verify-with.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            shell=True,
            cwd=config.command_dir(ws.original),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=config.record_timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return f"`{command}` timed out after {config.record_timeout:g} s"
    kill_group(proc)
    if code == 0:
        return ""
    return f"`{command}` exited with status {code}{last_lines(log)}"


def last_lines(log: Path, count: int = 5) -> str:
    """Return the last non-blank lines of the command's output, as a suffix (':\n  ...')."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()][-count:]
    return ":\n" + "\n".join(f"  {line}" for line in lines) if lines else ""


def collect(ws: Workspace, max_calls: int) -> dict[str, Recorded]:
    """Return the recorded calls per plan id, the first `max_calls` of each."""
    metas: dict[str, list[tuple[Path, dict[str, Any]]]] = defaultdict(list)
    for sidecar in sorted(ws.records.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
        metas[meta["target"]].append((sidecar.with_suffix(".pkl"), meta))
    out = {target: recorded(items, max_calls) for target, items in metas.items()}
    for target in [t for t in out if t.endswith(RETURNED)]:
        returned = out.pop(target)
        base = out.get(target.removesuffix(RETURNED))
        if base is not None:
            out[target.removesuffix(RETURNED)] = replace(base, returned=returned)
    return out


def recorded(items: list[tuple[Path, dict[str, Any]]], max_calls: int) -> Recorded:
    """Return the first `max_calls` recorded calls of one target, with the first's context."""
    first = items[0][1]
    return Recorded(
        files=tuple(str(p) for p, _ in items[:max_calls]),
        contexts=tuple((rel, int(line)) for rel, line in first["contexts"]),
        meshes=tuple(first["meshes"]),
        shapes=tuple(first["shapes"]),
    )


def record(command: str, plans: Sequence[Plan], ws: Workspace, config: VerifyConfig) -> Recording:
    """Run `command` with the recorder and return what it recorded for `plans`."""
    plan_file = ws.base / "record-plan.json"
    plan_file.write_text(json.dumps(recording_plan(plans, ws, config.max_calls)), encoding="utf-8")
    started = time.monotonic()
    note = run_command(command, ws, config, plan_file)
    calls = collect(ws, config.max_calls)
    seconds = time.monotonic() - started
    return Recording(calls, note or f"`{command}` ran in {seconds:.1f} s", note)
