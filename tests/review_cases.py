"""What the interactive review tests share: sources with known sites, the CLI, the engine's
rendering of a chosen subset of sites."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import clitools

from jaxmigrate.model import Options
from jaxmigrate.pipeline.files import migrate_text

# Four safe sites, in line order: JM101 (line 2), JM103 (13), JM102 (14), JM103 (15).
SAFE = """\
import jax
from jax.experimental.maps import Mesh
from jax.experimental.pjit import pjit
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P


def f(x):
    return x * 2


mesh = Mesh(jax.devices(), ("x",))
g = pjit(f)
h = shard_map(f, mesh, in_specs=P("x"), out_specs=P("x"), check_rep=False)
k = pjit(f, donate_argnums=0)
"""
SECOND = "from jax.experimental.pjit import pjit\n\ng = pjit(abs)\n"
PMAP = """\
import jax


def step(x):
    return jax.lax.pmean(x * 2, "i")


run = jax.pmap(step, axis_name="i")
"""
GROUPED = """\
import numpy as np
import jax
from jax.sharding import Mesh, PartitionSpec as P
from jax.experimental.pjit import pjit


def main():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    with mesh:
        f = pjit(lambda a: a * 2, in_shardings=P("x"), out_shardings=P("x"))
        return f(np.ones((8, 2)))
"""
PROMPT = "Apply this site?"


def jm(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run `jaxmigrate run --interactive ARGS`, answering with `stdin`."""
    return clitools.jm("run", "--interactive", *args, cwd=cwd, stdin=stdin, timeout=120)


def rendered(code: str, accepted: Iterable[int], path: str = "/x.py", **options: bool) -> str:
    """The engine's rendering of `code` with only the sites at positions `accepted` (in file
    order: notebook cell, line, column). The default path is in no project: the layout is the
    code's own, as for a file in a temporary directory (a relative path would be in this
    repository, whose ruff line-length the engine would follow)."""
    every = migrate_text(code, path=path, options=Options()).sites
    keys = {every[i].key for i in accepted}
    migration = migrate_text(
        code,
        path=path,
        options=Options(**options),
        accept=lambda sites: [replace(s, applied=s.key in keys) for s in sites],
    )
    assert {s.key for s in migration.sites if s.applied} == keys
    return migration.code


def changed_lines(output: str) -> list[str]:
    """The removed and added lines of the one diff in `output`."""
    body = output.split("+++ b/")[1].split("\n", 1)[1]
    return [line for line in body.splitlines() if line.startswith(("+", "-"))]


def progress_file(root: Path) -> Path:
    return root / ".jaxmigrate_cache" / "review.json"
