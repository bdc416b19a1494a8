"""`jaxmigrate verify --against REV`: verify a migration made by hand (or by another tool).

Each module-level function or assigned name whose code differs between git revision `REV` and
the working tree becomes a site; the revision's text is the original, the working tree's the
candidate, and the usual targets, inputs, workers and statuses apply.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Sequence
from pathlib import Path

from jaxmigrate.model import Safety, Site
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.notebooks import command_for, program, script_path
from jaxmigrate.verify.planner import HAND_MIGRATION
from jaxmigrate.verify.session import Key, verify
from jaxmigrate.verify.targets import DEFS, assigned_names, start_line

CODE = "JM000"
NAME = HAND_MIGRATION


class GitError(ValueError):
    """`REV` or the paths could not be read from git."""


def git(root: Path, *args: str) -> str:
    """Return the output of a git command run in `root`; raise GitError on failure."""
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise GitError(
            proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "git failed"
        )
    return proc.stdout


def changed_files(root: Path, rev: str, paths: Sequence[str]) -> list[str]:
    """Return the Python files modified between `rev` and the working tree, relative to root."""
    out = git(root, "diff", "--name-only", "--relative", "--diff-filter=M", rev, "--", *paths)
    return [line for line in out.splitlines() if line.endswith((".py", ".ipynb"))]


def definitions(text: str) -> dict[str, ast.stmt]:
    """Return the module-level functions and singly assigned names of a module."""
    out: dict[str, ast.stmt] = {}
    for node in ast.parse(text).body:
        if isinstance(node, DEFS):
            out[node.name] = node
        elif len(names := assigned_names(node)) == 1:
            out[names[0]] = node
    return out


def changed_sites(old: str, new: str, rev: str) -> tuple[Site, ...]:
    """Return one unsafe site per definition whose code changed (located in the old text)."""
    before, after = definitions(old), definitions(new)
    sites = []
    for name, node in before.items():
        if name in after and ast.dump(node) != ast.dump(after[name]):
            line = start_line(node)
            sites.append(
                Site(
                    CODE,
                    NAME,
                    line,
                    node.col_offset + 1,
                    Safety.UNSAFE,
                    f"`{name}` changed since {rev}",
                    key=f"changed:{name}",
                )
            )
    return tuple(sites)


def requests_against(root: Path, rev: str, paths: Sequence[str]) -> list[VerifyRequest]:
    """Return a request per modified file, with its changed definitions as sites.

    A notebook's code cells are compared as the script that runs them (`verify.notebooks`),
    run by each side's interpreter; a notebook that cannot become one is left out.
    """
    requests = []
    for relpath in changed_files(root, rev, paths):
        old = git(root, "show", f"{rev}:./{relpath}")
        new = (root / relpath).read_text(encoding="utf-8")
        if relpath.endswith(".ipynb"):
            requests += notebook_against(relpath, old, new, rev)
            continue
        try:
            sites = changed_sites(old, new, rev)
        except SyntaxError:
            continue
        if sites:
            requests.append(VerifyRequest(relpath, old, new, sites))
    return requests


def verify_against(rev: str, paths: Sequence[str], config: VerifyConfig) -> dict[Key, Verdict]:
    """Verify every definition changed between `rev` and the working tree under `paths`.

    Returns a verdict per (path, `changed:<name>`); raises GitError if git cannot answer.
    """
    return verify(requests_against(config.root, rev, paths), config)


def notebook_against(relpath: str, old: str, new: str, rev: str) -> list[VerifyRequest]:
    """Return the request of a notebook changed by hand: its changed definitions, as sites."""
    before, after = program(old), program(new)
    if before.problem or after.problem:
        return []
    try:
        sites = changed_sites(before.code, after.code, rev)
    except SyntaxError:
        return []
    if not sites:
        return []
    return [
        VerifyRequest(
            script_path(relpath),
            before.code,
            after.code,
            sites,
            command=command_for(relpath),
            label=relpath,
            cells=before.starts,
        )
    ]
