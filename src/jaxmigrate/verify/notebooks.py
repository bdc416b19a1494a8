"""Notebooks: the code cells, run in order as one program, are the recording command and the unit.

A notebook's cells share one namespace and run top to bottom, so its sites are verified the way
bound sites are (`verify.bound`): the cells become a script (`nb.ipynb.py`, next to the notebook
in each side's copy; IPython lines masked with `pass`, as the rewriting masks them, the body of
a `%%time` or `%%capture` cell kept), run as `python nb.ipynb.py` from the notebook's folder on
the original copy (recording the calls of the callables created on the sites' statements) and on
the rewritten copy, and the recorded calls are compared. A notebook that cannot run here (an
import of a package not installed, a file not in the tree, a shell line whose effect it needs)
leaves its sites `unverified` with how it ended; `failed` only when the original ran and the
rewrite disagreed or raised.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
import shlex
import shutil
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jaxmigrate.model import Bucket, FileResult, Options, Safety, Site, Status
from jaxmigrate.pipeline.engine import decide, safe_alone
from jaxmigrate.pipeline.notebook import (
    NotebookError,
    code_cells,
    load,
    mask,
    migrate_notebook,
    split_lines,
)
from jaxmigrate.pipeline.project import verifying
from jaxmigrate.verify.bound import judge_one, rerun
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.judge import with_jax
from jaxmigrate.verify.planner import SAFE_REWRITES, Plan
from jaxmigrate.verify.pool import Worker
from jaxmigrate.verify.recording import PYTHON_VARIABLE, Recording, record
from jaxmigrate.verify.reference import jax_version_of
from jaxmigrate.verify.workspace import Workspace

# Cell magics whose body is plain Python that runs once: the body runs, the magic line is masked.
RUNNABLE_CELL_MAGICS = ("%%time", "%%capture")
# A notebook that asks `get_ipython()` (`'google.colab' in str(get_ipython())`) gets what
# `IPython.get_ipython()` returns outside IPython: the script's first line, before cell 1.
NO_IPYTHON = "get_ipython = lambda: None  # jaxmigrate: not run by IPython\n"
USES_GET_IPYTHON = re.compile(r"\bget_ipython\b")


@dataclass(frozen=True)
class Program:
    """A notebook's code cells as one script: where each cell starts, or why it cannot run."""

    code: str
    starts: dict[int, int]  # code cell number -> its first line in `code`
    problem: str = ""

    def locate(self, line: int) -> tuple[int, int]:
        """Return the code cell holding script line `line`, and the line within that cell."""
        return in_cell(self.starts, line)

    def line_of(self, site: Site) -> int:
        """Return the script line of a site located by notebook cell and line in the cell."""
        return self.starts[site.cell or 1] + site.line - 1


def in_cell(starts: Mapping[int, int], line: int) -> tuple[int, int]:
    """Return (cell, line in the cell) of a script line, given where each cell starts."""
    number = max((n for n, first in starts.items() if first <= line), default=1)
    return number, line - starts.get(number, 1) + 1


def located(sites: Sequence[Site], starts: Mapping[int, int]) -> tuple[Site, ...]:
    """Return sites found in a notebook's script located by cell and line in the cell."""
    out = []
    for site in sites:
        cell, line = in_cell(starts, site.line)
        out.append(replace(site, cell=cell, line=line))
    return tuple(out)


def cell_code(number: int, source: str) -> tuple[str, str]:
    """Return a cell's code with its IPython lines masked (same line count), or why it cannot run."""
    lines = split_lines(source)
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        magic = lines[first].split()[0]
        if magic not in RUNNABLE_CELL_MAGICS:
            return "", f"cell {number} is a {magic} cell, which cannot run outside IPython"
        body = mask("".join(lines[first + 1 :]))
        if body is None:
            return "", f"cell {number} holds a second cell magic"
        return "".join(lines[:first]) + "pass\n" + body.code, ""
    masked = mask(source)
    assert masked is not None  # only cell magics are refused
    return masked.code, ""


def program(text: str) -> Program:
    """Return the script that runs a notebook's code cells in order (never raises)."""
    try:
        cells = code_cells(load(text))
    except NotebookError as exc:
        return Program("", {}, str(exc))
    chunks: list[str] = []
    starts: dict[int, int] = {}
    line = 1
    for cell in cells:
        code, problem = cell_code(cell.number, cell.source)
        if problem:
            return Program("", {}, problem)
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError) as exc:
            why = getattr(exc, "msg", type(exc).__name__)
            return Program("", {}, f"cell {cell.number} is not Python once masked: {why}")
        if code and not code.endswith("\n"):
            code += "\n"
        starts[cell.number] = line
        chunks.append(code)
        line += code.count("\n")
    code = "".join(chunks)
    if USES_GET_IPYTHON.search(code):
        return Program(NO_IPYTHON + code, {cell: first + 1 for cell, first in starts.items()})
    return Program(code, starts)


def script_path(relpath: str) -> str:
    """Return where a notebook's script is written in each side's copy: next to the notebook."""
    return relpath + ".py"


def command_for(relpath: str) -> str:
    """Return the shell command that runs a notebook's script from the notebook's folder.

    It runs the interpreter of the side it runs on (`$JAXMIGRATE_PYTHON`, `recording.
    run_command`): the original's cells on the reference JAX under `--reference-jax`.
    """
    folder, name = posixpath.split(script_path(relpath).replace("\\", "/"))
    return f'cd {shlex.quote(folder or ".")} && exec "${PYTHON_VARIABLE}" {shlex.quote(name)}'


def notebook_request(
    relpath: str,
    old: str,
    candidate: str,
    sites: Sequence[Site],
    baseline: str | None = None,
    files: Mapping[str, str] | None = None,
) -> VerifyRequest | str:
    """Return the request that verifies a notebook's sites as its script's, or why it cannot.

    `baseline` is the notebook with only its safe sites rewritten: the reference when the
    original cells cannot run on the installed JAX (a removed import). `files`: the project
    modules the rewritten cells import (the code base's pmap helper), by path in the tree.
    """
    before, after = program(old), program(candidate)
    problem = before.problem or after.problem
    if problem:
        return f"the notebook cannot run here: {problem}"
    located = tuple(in_script(s, before) for s in sites)
    safe = program(baseline) if baseline is not None else None
    return VerifyRequest(
        baseline=safe.code if safe is not None and not safe.problem else None,
        path=script_path(relpath),
        original=before.code,
        candidate=after.code,
        sites=located,
        command=command_for(relpath),
        label=relpath,
        cells=before.starts,
        files=dict(files or {}),
    )


def in_script(site: Site, script: Program) -> Site:
    """Return a notebook's site located by its line in the cells' script; a program-level
    step's `layout` lines too (the layout adapters find the step by them)."""
    details, line = site.details, script.line_of(site)
    layout = details.get("layout")
    if layout is not None:  # the step's lines start at the site's (the pmap is the site)
        moved = {"line": line, "end_line": line + layout["end_line"] - layout["line"]}
        details = {**details, "layout": {**layout, **moved}}
    return replace(site, line=line, cell=None, details=details)


def verify_notebooks(
    plans: Sequence[Plan],
    candidates: dict[str, str],
    ws: Workspace,
    worker: Worker,
    config: VerifyConfig,
) -> dict[str, Verdict]:
    """Run each notebook's script on both sides and return a verdict per plan."""
    by_notebook: dict[str, list[Plan]] = defaultdict(list)
    for plan in plans:
        by_notebook[plan.path].append(plan)
    verdicts: dict[str, Verdict] = {}
    on_own = bool(config.reference_python)
    ran: dict[str, str] = {}
    for group in by_notebook.values():
        request = group[0].request
        command = request.command or ""
        # The script runs from the notebook's folder, whatever directory jaxmigrate ran from.
        run_config = replace(config, workdir=None, verify_with=command)
        if config.notebook_timeout is not None:  # `--timeout` bounds each run of the notebook
            run_config = replace(run_config, record_timeout=config.notebook_timeout)
        recording = record(command, group, ws, run_config)
        shown = f"{request.label} (its code cells, in order)"
        error = recording.error.replace(f"`{command}`", f"`{shown}`")
        reference, extra = "original", ""
        tried = [f"original: {last_line(recording.error)}"] if recording.error else []
        if recording.error and not any(p.id in recording.calls for p in group):
            safe = through_safe_rewrites(group, ws, run_config)
            if safe is not None and safe.calls:
                recording, reference = safe, SAFE_REWRITES
            elif safe is not None:
                extra = f"; with its safe rewrites only: {failure(group[0], safe.error, {})}"
        again = rerun(command, group, candidates, ws, run_config)
        again = replace(again, error=again.error.replace(f"`{command}`", f"`{shown}`"))
        named = replace(config, verify_with=shown)
        for plan in group:
            if plan.id not in recording.calls:
                verdicts[plan.id] = not_run(plan, error, request.cells, extra)
                continue
            verdict = judge_one(plan, recording, again, worker, named)
            details = {**verdict.details, "unit": "notebook", "reference": reference}
            verdicts[plan.id] = replace(verdict, details=details)
        demote(group, verdicts)
        ran = ran or versions(config, worker)
        for plan in group:
            verdicts[plan.id] = with_jax(verdicts[plan.id], tried, ran, on_own)
    return verdicts


def versions(config: VerifyConfig, worker: Worker) -> dict[str, str]:
    """Return the JAX each side of a notebook's verification ran: the original's cells ran on
    the reference interpreter under `--reference-jax`, the rewrite's on the target."""
    candidate = worker.jax or jax_version_of(config.python) or ""
    original = config.python_of("original")
    same = original == config.python
    return {
        "original": candidate if same else jax_version_of(original) or "",
        "candidate": candidate,
    }


def through_safe_rewrites(
    group: Sequence[Plan], ws: Workspace, config: VerifyConfig
) -> Recording | None:
    """Record the notebook with only its safe sites rewritten; None when it has no such text.

    The original cells failed (say, `from jax.experimental import PartitionSpec`): the safe
    rewrites alone may make them run on the installed JAX, and are then the reference.
    """
    request = group[0].request
    if request.baseline is None or request.baseline == request.original:
        return None
    tree = ws.base / f"run-{SAFE_REWRITES}"
    if not tree.exists():
        shutil.copytree(ws.original, tree, symlinks=True)
    (tree / request.path).write_text(request.baseline, encoding="utf-8")
    texts = {request.path: request.baseline}
    ran = rerun(request.command, group, texts, ws, config, side=SAFE_REWRITES)
    return Recording(ran.calls, error=ran.error)


def demote(group: Sequence[Plan], verdicts: dict[str, Verdict]) -> None:
    """Demote the verified sites of a notebook that has a failed one, in place.

    The cells ran with every site rewritten; without the failed one, the text that will be
    written was not run.
    """
    if not any(verdicts[p.id].status is Status.FAILED for p in group):
        return
    note = "not re-verified without the failed sites of its notebook"
    for plan in group:
        verdict = verdicts[plan.id]
        if verdict.status is Status.VERIFIED:
            details = {**verdict.details, "verified_with_all_sites": True}
            verdicts[plan.id] = Verdict(Status.UNVERIFIED, note, details)


def last_line(error: str) -> str:
    """Return the last line of a command's output (its exception), or ''."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def not_run(plan: Plan, error: str, starts: Mapping[int, int], extra: str = "") -> Verdict:
    """Return the verdict of a site the notebook's cells never called.

    When the cells failed, the reason is the exception's last line and the cell it came from;
    the command's last lines are in the details (`notebook_error`).
    """
    details: dict[str, Any] = {"target": plan.label, "unit": "notebook"}
    if not error:
        why = "the notebook's cells, run in order, made no call of it"
        return Verdict(Status.UNVERIFIED, why, details)
    details["notebook_error"] = error
    why = f"the notebook cannot run here: {failure(plan, error, starts)}{extra}"
    return Verdict(Status.UNVERIFIED, why, details)


def failure(plan: Plan, error: str, starts: Mapping[int, int]) -> str:
    """Return the exception that stopped the script, and where in the notebook, from its output."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:  # the cells ran to the end: they just never called the site
        return "the cells ran, but made no call of it"
    last = lines[-1]
    script = posixpath.basename(plan.path)
    places = [
        int(match.group(1))
        for line in lines
        if (match := re.search(rf'File ".*{re.escape(script)}", line (\d+)', line))
    ]
    if not places or not starts:
        return last
    cell, line = in_cell(starts, places[-1])
    return f"{last} (cell {cell}, line {line})"


def request_for_notebook(result: FileResult, relpath: str, options: Options) -> VerifyRequest | str:
    """Return the request of a migrated notebook (every site rewritten, in the fallback forms
    chosen for it, `result.fallbacks`), or why it cannot run."""
    old, fallbacks = result.old_text or "", result.fallbacks
    project = verifying()  # the code base as the first run read it: the helper imported
    everything = migrate_notebook(
        old,
        options=replace(options, unsafe_fixes=True),
        path=result.path,
        project=project,
        fallbacks=fallbacks,
    )
    safe = safe_alone(result.sites)

    def only_safe(sites: Sequence[Site]) -> Sequence[Site]:
        return [replace(s, applied=s.key in safe) for s in sites]

    baseline = None
    if safe:
        baseline = migrate_notebook(
            old,
            options=options,
            accept=only_safe,
            path=result.path,
            project=project,
            fallbacks=fallbacks,
        ).code
    base = Path(result.path).parent
    files = {
        os.path.normpath(Path(relpath).parent / os.path.relpath(f.path, base)): f.text
        for f in everything.files
    }
    return notebook_request(relpath, old, everything.code, result.sites, baseline, files)


def redecide_notebook(result: FileResult, sites: Sequence[Site], options: Options) -> FileResult:
    """Return the notebook migrated again, each site decided by the policy and its verdict."""
    by_key = {s.key: s for s in sites}

    def accept(found: Sequence[Site]) -> Sequence[Site]:
        marked = [
            replace(s, status=by_key[s.key].status, details=by_key[s.key].details)
            if s.key in by_key
            else s
            for s in found
        ]
        return decide(marked, options.unsafe_fixes)

    old = result.old_text or ""
    migration = migrate_notebook(
        old,
        options=options,
        accept=accept,
        path=result.path,
        project=verifying(),
        fallbacks=result.fallbacks,
    )
    bucket = Bucket.CHANGED if migration.code != old else Bucket.UNCHANGED
    return replace(
        result,
        sites=migration.sites,
        new_text=migration.code,
        bucket=bucket,
        files=migration.files,
    )


def cannot_run(sites: Sequence[Site], why: str) -> tuple[Site, ...]:
    """Return a notebook's sites, the unsafe ones unverified because the notebook cannot run."""
    return tuple(
        replace(
            s,
            status=Status.UNVERIFIED,
            details={**s.details, "verification": why, "unit": "notebook"},
        )
        if s.safety is Safety.UNSAFE
        else s
        for s in sites
    )
