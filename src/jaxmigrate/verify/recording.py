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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.planner import Plan
from jaxmigrate.verify.pool import child_env, kill_group
from jaxmigrate.verify.processes import coordinator_address, wait_all
from jaxmigrate.verify.targets import Kind
from jaxmigrate.verify.workspace import Workspace


@dataclass(frozen=True)
class Recorded:
    """The calls recorded for one target: pickles for the workers, and the first call's context."""

    files: tuple[str, ...]
    contexts: tuple[tuple[str, int], ...]
    meshes: tuple[dict[str, Any], ...]
    shapes: tuple[str, ...]


@dataclass(frozen=True)
class Recording:
    """What the command left: the calls per plan id, and how the command ended."""

    calls: dict[str, Recorded] = field(default_factory=dict)
    note: str = ""


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
    """Run the command on the original copy; return a note if it did not end cleanly.

    With `config.processes` N > 1 the command runs N times at once, as the processes of one JAX
    job (each records its own calls); the first process to fail names the note.
    """
    count = config.processes
    coordinator = coordinator_address() if count > 1 else ""
    procs = []
    for i in range(count):
        env = child_env(config, ws, (ws.boot,), i, coordinator)
        env["JAXMIGRATE_RECORD"] = str(plan_file)
        log = ws.logs / ("verify-with.log" if count == 1 else f"verify-with.p{i}.log")
        with log.open("ab") as out:
            procs.append(
                subprocess.Popen(
                    command,
                    shell=True,
                    cwd=config.command_dir(ws.original),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                )
            )
    codes = wait_all(procs, config.record_timeout)
    for proc in procs:
        kill_group(proc)
    return command_note(command, codes, config.record_timeout)


def command_note(command: str, codes: list[int | None], timeout: float) -> str:
    """Return how a (multi-process) command ended when not cleanly, else ''."""
    where = (lambda i: f" (process {i} of {len(codes)})") if len(codes) > 1 else (lambda i: "")
    for i, code in enumerate(codes):
        if code not in (0, None):
            return f"`{command}` exited with status {code}{where(i)}"
    if None in codes:
        return f"`{command}` timed out after {timeout:g} s{where(codes.index(None))}"
    return ""


def collect(ws: Workspace, max_calls: int, processes: int = 1) -> dict[str, Recorded]:
    """Return the recorded calls per plan id, the first `max_calls` of each.

    In a multi-process recording the files listed are process 0's; process i replays its own
    n-th call where process 0 replays its n-th (child/distributed.py), so only the calls that
    every process made are kept.
    """
    metas: dict[tuple[str, int], list[tuple[Path, dict[str, Any]]]] = defaultdict(list)
    for sidecar in sorted(ws.records.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
        metas[(meta["target"], meta.get("process", 0))].append((sidecar.with_suffix(".pkl"), meta))
    out = {}
    for (target, process), items in metas.items():
        if process != 0:
            continue
        made = min(len(metas.get((target, i), [])) for i in range(processes))
        if not made:
            continue
        first = items[0][1]
        out[target] = Recorded(
            files=tuple(str(p) for p, _ in items[: min(max_calls, made)]),
            contexts=tuple((rel, int(line)) for rel, line in first["contexts"]),
            meshes=tuple(first["meshes"]),
            shapes=tuple(first["shapes"]),
        )
    return out


def record(command: str, plans: Sequence[Plan], ws: Workspace, config: VerifyConfig) -> Recording:
    """Run `command` with the recorder and return what it recorded for `plans`."""
    plan_file = ws.base / "record-plan.json"
    plan_file.write_text(json.dumps(recording_plan(plans, ws, config.max_calls)), encoding="utf-8")
    started = time.monotonic()
    note = run_command(command, ws, config, plan_file)
    calls = collect(ws, config.max_calls, config.processes)
    seconds = time.monotonic() - started
    return Recording(calls, note or f"`{command}` ran in {seconds:.1f} s")
