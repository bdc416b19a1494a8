"""Run the user's `--verify-with` command on the original copy and collect the recorded calls.

The command runs in a shell in the original copy, with the recorder's bootstrap first on
`PYTHONPATH` and a plan naming what to record: for each callable target the lines (`span`) whose
legacy-API calls create it, for each function target its module and name. The parent reads only
the JSON sidecars; the pickled arguments are opened by the workers.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jaxmigrate.toolkit.facts import parse
from jaxmigrate.verify import lifetime
from jaxmigrate.verify.child.distributed import STDOUT
from jaxmigrate.verify.child.protocol import (
    CommandPaths,
    ProtocolError,
    RecordedCall,
    RecordPlan,
    decode_command_paths,
    decode_recorded_call,
    encode,
)
from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.planner import Plan, reach_spans
from jaxmigrate.verify.pool import child_env, kill_group
from jaxmigrate.verify.processes import Coordinator, wait_all
from jaxmigrate.verify.targets import Kind, method_at, site_span
from jaxmigrate.verify.workspace import Workspace

PRINTED_LIMIT = 16 * 2**20  # bytes of a command's standard output compared (`printed`)
RETURNED = ".returned"  # the recorder's suffix for the calls of a factory's returned function
MODULE_TOOLS = {"pytest": "pytest", "py.test": "pytest"}  # commands that are `python -m` a module
PYTHON_VARIABLE = "JAXMIGRATE_PYTHON"  # the interpreter of the side a command runs on


# What a command printed on its standard output, per process: its lines (None: too much)
Printed = tuple[tuple[str, ...] | None, ...]


@dataclass(frozen=True)
class Recorded:
    """The calls recorded for one target: pickles for the workers, and the first call's context."""

    files: tuple[str, ...]
    contexts: tuple[tuple[str, int], ...]
    meshes: tuple[dict[str, Any], ...]
    shapes: tuple[str, ...]
    returned: Recorded | None = None  # the calls of the function the target returned
    frames: tuple[tuple[str, int], ...] = ()  # the first call's callers in the tree: file, line


@dataclass(frozen=True)
class Recording:
    """What the command left: the calls per plan id, and how the command ended."""

    calls: dict[str, Recorded] = field(default_factory=dict)
    note: str = ""
    error: str = ""  # how the command failed, with the last lines of its output; '' if it did not
    supplied: dict[str, str] = field(default_factory=dict)  # plan id -> the tests that recorded it
    printed: Printed = ()  # the command's standard output, per process (`printed`)
    # function targets a call ran every site of (`ran_targets`), with the lines each process
    # had printed when that call began (`lines_before`; None: not known)
    ran: dict[str, tuple[int | None, ...]] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)  # target -> what its calls never ran


@dataclass(frozen=True)
class MethodWatch:
    """The method of a module-level class holding a bound plan's program-level group edits
    (big_vision's `Evaluator.run`): the recorder watches its calls as a function target's, so
    that a call that ran the edits (`Recording.ran`) lets what the command prints judge them
    (`verify.groups`); its calls are not recorded."""

    id: str  # the recorder's target: its `ran` and `missed` marks
    qualname: str  # `Evaluator.run`
    spans: tuple[tuple[int, int], ...]  # the edits' statements a call must all run


def method_watch(plan: Plan) -> MethodWatch | None:
    """Return the watch over the method holding a bound plan's sites, when they are all edits
    of a program-level group in one method of a module-level class; else None."""
    if plan.target.kind is not Kind.BOUND or not all(s.group_edit for s in plan.sites):
        return None
    tree = parsed(plan.request.original)
    if tree is None:
        return None
    methods = {method_at(tree, s.line) for s in plan.sites}
    found = methods.pop() if len(methods) == 1 else None
    if found is None:
        return None
    qualname, header = found
    key = hashlib.sha1(f"{plan.path}::{qualname}".encode()).hexdigest()[:12]
    # an edit on the method's header (a conversion at its entry) runs with every call: not watched
    body = [s.line for s in plan.sites if s.line > header]
    return MethodWatch(f"m{key}", qualname, tuple(dict.fromkeys(site_span(tree, n) for n in body)))


@functools.lru_cache(maxsize=32)
def parsed(text: str) -> ast.Module | None:
    """Return a file's tree, parsed once per text (read only): `method_watch` is asked for
    every bound plan, several times in a run."""
    return parse(text)


def recording_plan(plans: Sequence[Plan], ws: Workspace, max_calls: int) -> RecordPlan:
    """Return the recorder's plan: spans for callable and bound targets, functions for the rest.

    Bound targets have their outputs recorded too: their command is the unit, compared on both
    trees (`verify.bound`). A bound target that is a program-level step (its site's `layout`)
    is recorded in the flat layout on the original tree, so that its calls compare with the
    rewrite's `jax.jit` step's. On several processes each records its own part: its devices'
    blocks of the original's batch, its rows of the rewrite's global arrays
    (`hostify.process_local`).
    """
    spans: dict[str, list[list[Any]]] = defaultdict(list)
    functions: dict[str, dict[str, str]] = defaultdict(dict)
    reach = {p.id: reach_spans(p) for p in plans if p.target.kind is Kind.FUNCTION}
    for plan in plans:
        target = plan.target
        if target.kind in (Kind.CALLABLE, Kind.BOUND):
            spans[plan.path].append([target.first, target.last, plan.id])
        if target.kind is not Kind.BOUND and "." not in target.qualname:
            functions[plan.module].setdefault(target.qualname, plan.id)
        watch = method_watch(plan)
        if watch is not None:  # a group's edits in a method: only watched
            functions[plan.module].setdefault(watch.qualname, watch.id)
            held = reach.setdefault(watch.id, [])
            held.extend(list(span) for span in watch.spans if list(span) not in held)
    return RecordPlan(
        root=str(scratch(ws, "original")),
        out=str(ws.records),
        max_calls=max_calls,
        spans=dict(spans),
        functions=dict(functions),
        outputs=[p.id for p in plans if p.target.kind is Kind.BOUND],
        deep=sorted({p.path for p in plans if p.request.command}),
        helpers=helpers(plans),
        # only the calls of a function target that run its sites are worth recording
        reach=reach,
        layouts={p.id: layout for p in plans if (layout := step_layout(p))},
    )


def step_layout(plan: Plan) -> dict[str, Any] | None:
    """Return the layout of a bound plan made for one program-level step's statement, or None."""
    if plan.target.kind is not Kind.BOUND or len(plan.sites) != 1:
        return None
    layout = plan.sites[0].details.get("layout")
    return layout if isinstance(layout, dict) else None


def helpers(plans: Sequence[Plan]) -> list[str]:
    """Return the project files the rewrites wrote or changed besides their own (the helper
    module `_pmap_compat.py`): a legacy-API call made there is made for its caller's line."""
    return sorted({path for p in plans for path in p.request.files} - {p.path for p in plans})


def scratch(ws: Workspace, side: str) -> Path:
    """Return a copy of one side's tree for the command to run in, made on first use.

    The command may write into the tree (checkpoints, caches); the workers replay on the
    untouched copy, so a replay never starts from what the recording left behind.
    """
    path = ws.base / f"run-{side}"
    if not path.exists():
        shutil.copytree(ws.tree(tree_side(side)), path, symlinks=True)
    return path


def alone(ws: Workspace, side: str, texts: dict[str, str]) -> Path:
    """Return a copy of the original tree with `texts` (one file's rewrite and the helpers it
    writes) in place, for `side`'s run of the command (`scratch` then finds it)."""
    path = ws.base / f"run-{side}"
    shutil.copytree(ws.tree("original"), path, symlinks=True, dirs_exist_ok=True)
    for relpath, text in texts.items():
        (path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (path / relpath).write_text(text, encoding="utf-8")
    return path


def tree_side(side: str) -> str:
    """Return the tree a run's side copies: "original" for the original's runs (the first, and
    `AGAIN`, the second that tells what varies), else "candidate"."""
    return "original" if side.startswith("original") else "candidate"


AGAIN = "original-again"  # the original's second run, for what differs between two runs


def log_name(side: str) -> str:
    """Return the stem of one side's command logs (`verify-with`, `verify-with-candidate`)."""
    return "verify-with" if side == "original" else f"verify-with-{side}"


def stdout_files(ws: Workspace, side: str, count: int) -> list[Path]:
    """Return where each process of one side's command run wrote its standard output."""
    name = log_name(side)
    return [
        ws.logs / (f"{name}.stdout" if count == 1 else f"{name}.p{i}.stdout") for i in range(count)
    ]


def printed(ws: Workspace, side: str, count: int) -> Printed:
    """Return the lines each process of one side's last command run printed on its standard
    output, less the lines JAX's runtime writes there (gloo's, on several processes), with the
    side's copy of the tree written `<tree>` (`shown.the_programs`, `shown.placed`); None for a
    process that printed more than `PRINTED_LIMIT` bytes, which is not compared."""
    from jaxmigrate.verify.child.shown import placed, the_programs

    out: list[tuple[str, ...] | None] = []
    for path in stdout_files(ws, side, count):
        try:
            with path.open("rb") as handle:
                data = handle.read(PRINTED_LIMIT + 1)
        except OSError:
            data = b""
        if len(data) > PRINTED_LIMIT:
            out.append(None)
            continue
        lines = data.decode("utf-8", errors="replace").splitlines()
        out.append(tuple(placed(the_programs(lines), str(scratch(ws, side)))))
    return tuple(out)


def mirror_folders(ran: Path, tree: Path) -> None:
    """Create in `tree` the folders the command created in `ran`, without their files.

    A replay then starts from the project's files as they were before the command, with the
    folders it made (`os.makedirs(workdir)` before the first step), never from a checkpoint
    the recording wrote, which would make both sides restore it and run nothing.
    """
    for folder in sorted(p for p in ran.rglob("*") if p.is_dir() and not p.is_symlink()):
        (tree / folder.relative_to(ran)).mkdir(parents=True, exist_ok=True)


def tool_shims(ws: Workspace, python: str) -> Path:
    """Return a folder of `pytest` scripts that run `python -m pytest`, for the command's PATH.

    The interpreter's own folder comes first on the command's PATH, but a virtualenv made with
    `--system-site-packages` (or `pip install --user`) has no `pytest` script of its own: the
    word `pytest` would find another interpreter's, which cannot import the project's
    dependencies installed in the virtualenv. A tool the interpreter's folder lacks runs as a
    module of the interpreter instead.
    """
    # one folder per interpreter: the original side may run another (`--reference-jax`)
    folder = ws.base / "bin" / hashlib.sha1(python.encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    bindir = Path(python).parent
    for name, module in MODULE_TOOLS.items():
        script = folder / name
        if (bindir / name).exists() or script.exists():
            continue
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} -m {module} "$@"\n')
        script.chmod(0o755)
    return folder


def run_command(
    command: str, ws: Workspace, config: VerifyConfig, plan_file: Path, side: str = "original"
) -> str:
    """Run the command on one side's copy; return a note if it did not end cleanly.

    The copy (and its `src/`) comes first on the path: the project's packages import from the
    copy, not from an installed (or editable) version of them. With `config.processes` N > 1
    the command runs N times at once, as the processes of one JAX job (each records its own
    calls); the first process to fail names the note.
    """
    tree = scratch(ws, side)
    try:
        same_start(command, ws, config, first=side == "original")
    except ProtocolError as exc:
        return f"`{command}` was not run: its paths outside the project were kept as {exc}"
    imports = tuple(p for p in (tree, tree / "src") if p.is_dir())
    count = config.processes
    with (
        Coordinator() if count > 1 else contextlib.nullcontext() as held,
        contextlib.ExitStack() as files,
    ):
        coordinator = held.address if held is not None else ""  # its port held till the end
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        stdouts = stdout_files(ws, side, count)
        for i, stdout in enumerate(stdouts):
            python = config.python_of(tree_side(side))
            env = child_env(config, ws, (ws.boot, *imports), i, coordinator, python)
            env["JAXMIGRATE_RECORD"] = str(plan_file)
            env[STDOUT] = str(stdout)  # where a call began in it (`recorder.stdout_offset`)
            env[PYTHON_VARIABLE] = python  # a notebook's script runs on its side's (`notebooks`)
            env["PATH"] = os.pathsep.join([str(tool_shims(ws, python)), env["PATH"]])
            name = log_name(side)
            log = ws.logs / (f"{name}.log" if count == 1 else f"{name}.p{i}.log")
            logs.append(log)
            out = files.enter_context(log.open("ab"))
            try:
                proc = lifetime.spawn(
                    ["/bin/sh", "-c", command],
                    cwd=config.command_dir(tree),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=files.enter_context(stdout.open("wb")),
                    stderr=out,
                )
            except OSError as exc:
                out.write(f"cannot run the command: {exc}\n".encode())
                for proc in procs:
                    kill_group(proc)
                return f"`{command}` could not be started: {exc}"
            procs.append(proc)
        try:
            codes = wait_all(procs, config.record_timeout)
        finally:
            for proc in procs:
                kill_group(proc)
        note = command_note(command, codes, config.record_timeout)
        failed = next((i for i, code in enumerate(codes) if code not in (0, None)), None)
        if note and failed is not None:
            return note + failure_tail(logs[failed], stdouts[failed])
        return note


def same_start(command: str, ws: Workspace, config: VerifyConfig, first: bool) -> None:
    """Give every run of `command` the same start in the folders outside the tree it names.

    `python train.py /tmp/work` writes its checkpoint to /tmp/work: the run on the rewritten
    tree would restore it and make other calls, or none. Before the first run, each absolute
    path of the command outside the project is kept (`child/outside.py`: copied, or noted as
    absent; not over 256 MiB); before a later run, it is laid again as it was.
    """
    from jaxmigrate.verify.child.outside import keep, lay_path, outside_arguments

    record = ws.base / "command-paths"
    saved = ws.base / "command-paths.json"
    if first and not saved.exists():
        words = [w for w in shlex_split(command) if w.startswith(os.sep)]
        found = outside_arguments(words, {}, [str(config.root), str(ws.base)])
        saved.write_text(encode(CommandPaths(kept=keep(found, str(record)))), encoding="utf-8")
    elif not first and saved.exists():
        for k, entry in enumerate(decode_command_paths(saved.read_text(encoding="utf-8")).kept):
            if not entry.get("error"):
                lay_path(entry["path"], f"{record}.jaxmigrate-snap{k}")


def shlex_split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def command_note(command: str, codes: list[int | None], timeout: float) -> str:
    """Return how a (multi-process) command ended when not cleanly, else ''."""
    where = (lambda i: f" (process {i} of {len(codes)})") if len(codes) > 1 else (lambda i: "")
    for i, code in enumerate(codes):
        if code not in (0, None):
            return f"`{command}` exited with status {code}{where(i)}"
    if None in codes:
        return f"`{command}` timed out after {timeout:g} s{where(codes.index(None))}"
    return ""


def failure_tail(log: Path, stdout: Path) -> str:
    """Return how a failed command's output ended, as a suffix (`last_lines`): its standard
    error's when it holds a Python traceback (an exception), else its standard output's (a
    test runner's summary, `pytest`'s), else its standard error's.

    The two streams go to files of their own (the log, and what it printed, which a group's
    edits are judged by: `verify.groups`), so which one ended the run is not known.
    """
    try:
        errors = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        errors = ""
    if "Traceback (most recent call last):" in errors:
        return last_lines(log)
    return last_lines(stdout) or last_lines(log)


def last_lines(log: Path, count: int = 5) -> str:
    """Return the last non-blank lines of the command's output, as a suffix (':\n  ...')."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()][-count:]
    return ":\n" + "\n".join(f"  {line}" for line in lines) if lines else ""


def notes(folder: Path, kind: str) -> dict[str, dict[int, str]]:
    """Return, per target and per process, the text of the recorder's notes of one kind
    (`Recorder.note_once`: `<target>.<kind>.p<process>`)."""
    out: dict[str, dict[int, str]] = {}
    for path in sorted(folder.glob(f"*.{kind}.p*")):
        target, _, process = path.name.rpartition(f".{kind}.p")
        try:
            out.setdefault(target, {})[int(process)] = path.read_text(encoding="utf-8")
        except (OSError, ValueError):
            continue
    return out


ELSEWHERE = -1  # a process whose calls took another path: none of its lines shows the call


def ran_targets(folder: Path, processes: int) -> dict[str, tuple[int | None, ...]]:
    """Return the function targets one of whose calls ran every site of it in some process,
    and that every other process called too, seen by the recorder's line watch (`Recorder.ran`,
    `Recorder.missed`: recorded or not; under another tracer nothing is watched, and nothing is
    noted), with the bytes each process had printed when that call began (None where not
    known; `ELSEWHERE` for a process whose calls took another path).

    A site that runs on process 0 alone (big_vision's `main` logs and checkpoints there) does
    nothing on the others: what process 0 prints shows it, and what each other process prints
    is compared all the same."""
    ran, missed = notes(folder, "ran"), notes(folder, "missed")
    out = {}
    for target, texts in ran.items():
        elsewhere = missed.get(target, {})
        if all(i in texts or i in elsewhere for i in range(processes)):
            out[target] = tuple(
                (int(texts[i]) if texts[i].isdigit() else None) if i in texts else ELSEWHERE
                for i in range(processes)
            )
    return out


def missed_targets(folder: Path) -> dict[str, str]:
    """Return, per function target a call of which took another path than its sites, what it
    never ran (`Recorder.missed`: "never ran the site's line 595"), as the first process that
    noted it saw it."""
    return {target: texts[min(texts)] for target, texts in notes(folder, "missed").items()}


def lines_before(
    ws: Workspace, side: str, offsets: tuple[int | None, ...]
) -> tuple[int | None, ...]:
    """Return, per process of one side's command run, how many of the lines `printed` returns
    it had printed before `offsets[i]` bytes (None where the offset is not known; for a process
    whose calls took another path, more lines than it can print)."""
    from jaxmigrate.verify.child.shown import the_programs

    out: list[int | None] = []
    for path, offset in zip(stdout_files(ws, side, len(offsets)), offsets, strict=True):
        if offset == ELSEWHERE:  # every line of it is before: none counts
            out.append(PRINTED_LIMIT)
            continue
        try:
            with path.open("rb") as handle:
                data = handle.read(offset) if offset is not None else None
        except OSError:
            data = None
        text = data.decode("utf-8", errors="replace") if data is not None else None
        out.append(len(the_programs(text.splitlines())) if text is not None else None)
    return tuple(out)


def collect(
    ws: Workspace,
    max_calls: int,
    processes: int = 1,
    folder: Path | None = None,
    refused: list[str] | None = None,
) -> dict[str, Recorded]:
    """Return the recorded calls per plan id, the first `max_calls` of each.

    In a multi-process recording the files listed are process 0's; process i replays its own
    n-th call where process 0 replays its n-th (child/distributed.py), so only the calls that
    every process made are kept. A sidecar this protocol does not read (a recorder of another
    jaxmigrate) is left out, its file and why added to `refused`.
    """
    metas: dict[tuple[str, int], list[tuple[Path, RecordedCall]]] = defaultdict(list)
    where = ws.records if folder is None else folder
    for sidecar in sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime_ns):
        try:
            meta = decode_recorded_call(sidecar.read_bytes())
        except ProtocolError as exc:
            if refused is not None:
                refused.append(f"{sidecar.name}: {exc}")
            continue
        metas[(meta.target, meta.process)].append((sidecar.with_suffix(".pkl"), meta))
    out = {}
    for (target, process), items in metas.items():
        if process != 0:
            continue
        made = min(len(metas.get((target, i), [])) for i in range(processes))
        if made:
            out[target] = recorded(items, min(max_calls, made))
    for target in [t for t in out if t.endswith(RETURNED)]:
        returned = out.pop(target)
        base = out.get(target.removesuffix(RETURNED))
        if base is not None:
            out[target.removesuffix(RETURNED)] = replace(base, returned=returned)
    return out


def recorded(items: list[tuple[Path, RecordedCall]], max_calls: int) -> Recorded:
    """Return the first `max_calls` recorded calls of one target, with the first's context."""
    first = items[0][1]
    return Recorded(
        files=tuple(str(p) for p, _ in items[:max_calls]),
        contexts=tuple((rel, int(line)) for rel, line in first.contexts),
        frames=tuple((rel, int(line)) for rel, line in first.frames),
        meshes=tuple(first.meshes),
        shapes=tuple(first.shapes),
    )


def record(command: str, plans: Sequence[Plan], ws: Workspace, config: VerifyConfig) -> Recording:
    """Run `command` with the recorder and return what it recorded for `plans`."""
    plan_file = ws.base / "record-plan.json"
    plan = recording_plan(plans, ws, config.max_calls)
    plan_file.write_text(encode(plan), encoding="utf-8")
    started = time.monotonic()
    note = run_command(command, ws, config, plan_file)
    refused: list[str] = []
    calls = collect(ws, config.max_calls, config.processes, refused=refused)
    seconds = time.monotonic() - started
    for side in ("original", "candidate"):
        mirror_folders(scratch(ws, "original"), ws.tree(side))
    shown = note or f"`{command}` ran in {seconds:.1f} s"
    if refused:
        shown += f"; {len(refused)} recorded call(s) refused: {refused[0]}"
    shown_lines = printed(ws, "original", config.processes)
    ran = {
        target: lines_before(ws, "original", offsets)
        for target, offsets in ran_targets(ws.records, config.processes).items()
    }
    missed = missed_targets(ws.records)
    return Recording(calls, shown, note, printed=shown_lines, ran=ran, missed=missed)


def record_again(
    command: str, plans: Sequence[Plan], ws: Workspace, config: VerifyConfig
) -> tuple[Printed, str]:
    """Run `command` once more on a fresh copy of the original, recording as the first run did
    (into a folder of its own, never read); return what it printed and how it ended. What
    differs from the first run's output (a date, a random draw) is not the rewrite's doing."""
    folder = ws.base / f"records-{AGAIN}"
    folder.mkdir(exist_ok=True)
    plan = replace(
        recording_plan(plans, ws, config.max_calls), root=str(scratch(ws, AGAIN)), out=str(folder)
    )
    plan_file = ws.base / f"record-plan-{AGAIN}.json"
    plan_file.write_text(encode(plan), encoding="utf-8")
    error = run_command(command, ws, config, plan_file, side=AGAIN)
    return printed(ws, AGAIN, config.processes), error


def supplement(
    recording: Recording, plans: Sequence[Plan], ws: Workspace, config: VerifyConfig
) -> Recording:
    """Record the function targets the command never called through the project's own tests
    that call them (`discover`); the other targets keep what the command recorded."""
    from jaxmigrate.verify.discover import LIMIT, described, pytest_command, tests_calling

    wanted = [
        p
        for p in plans
        if p.target.kind is Kind.FUNCTION
        and "." not in p.target.qualname
        and p.id not in recording.calls
    ]
    tests = {p.id: tests_calling(config.root, p.target.qualname) for p in wanted}
    wanted = [p for p in wanted if tests[p.id]]
    ids = list(dict.fromkeys(i for p in wanted for i in tests[p.id]))[:LIMIT]
    if not ids:
        return recording
    plan_file = ws.base / "record-plan-tests.json"
    plan = recording_plan(wanted, ws, config.max_calls)
    plan_file.write_text(encode(plan), encoding="utf-8")
    command = pytest_command(config.python_of("original"), scratch(ws, "original"), ids)
    run_command(command, ws, config, plan_file)
    found = collect(ws, config.max_calls, config.processes)
    calls = dict(recording.calls)
    supplied = dict(recording.supplied)
    for p in wanted:
        if p.id in found:
            calls[p.id] = found[p.id]
            supplied[p.id] = described([i for i in tests[p.id] if i in ids])
    return replace(recording, calls=calls, supplied=supplied)
