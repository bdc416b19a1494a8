"""Module-level code the program-level form leaves unread goes with it (`codemods/pmap/_dead.py`,
`left_unread`): flax imagenet's `sync_batch_stats`, whose calls on the step's equal copies the
rewrite deletes, and the `cross_replica_mean` pmap only it calls, as flax's engineers deleted both
(e637bb39). Each deletion is a site of the program's group, taking the group's verdict
(`verify.session.with_deleted`); the function returning the state it no longer stacks is compared against
device 0's copy of the original's (`verify/child/layouts.one_copy`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from clitools import jm
from conftest import FIXTURES
from multihost import run_job

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.verify.child.layouts import one_copy
from jaxmigrate.verify.child.values import Flat

PROJECT = FIXTURES / "pmap" / "projects" / "script_callers"
EXPECTED = PROJECT / "examples" / "imagenet" / "train.expected.py"
SYNC = "def sync_batch_stats(state):"
MEAN = "cross_replica_mean = jax.pmap("


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the fixture project (a folder of scripts); its folder of `train.py`."""
    shutil.copytree(PROJECT, tmp_path / "p", ignore=shutil.ignore_patterns("*.expected.py"))
    return tmp_path / "p" / "examples" / "imagenet"


def migrated(folder: Path, source: str | None = None) -> tuple[str, list[str], list[str | None]]:
    """The rewritten `train.py` of `folder` (or `source` read as it), its JM202 messages, and
    their groups."""
    path = folder / "train.py"
    text = path.read_text() if source is None else source
    result = migrate_source(text, options=Options(unsafe_fixes=True), path=str(path))
    sites = [s for s in result.sites if s.code == "JM202"]
    return result.code, [s.message for s in sites], [s.group for s in sites]


def test_the_mean_and_its_only_reader_go_with_the_program(project: Path) -> None:
    code, messages, groups = migrated(project)
    assert code == EXPECTED.read_text()
    assert SYNC not in code and "cross_replica_mean" not in code
    assert "shard_map_per_device" not in code  # no faithful helper for a pmap that is gone
    gone = [m for m in messages if "deleted with `cross_replica_mean`" in m]
    assert gone == [
        (
            "`jax.pmap` -> deleted with `cross_replica_mean` (program-level): read only by "
            "`sync_batch_stats`, deleted too; nothing else in the code base uses it"
        )
    ]
    assert (
        "a def deleted, `sync_batch_stats`: its calls, means over devices of a step's equal "
        "copies, deleted; nothing else in the code base uses it"
    ) in messages
    assert len(set(groups)) == 1 and groups[0] is not None  # one group: written whole or not


def test_a_sibling_calling_the_def_keeps_it_and_the_mean(project: Path) -> None:
    (project / "other.py").write_text("import train\n\ntrain.sync_batch_stats(None)\n")
    code, messages, _ = migrated(project)
    assert SYNC in code and "cross_replica_mean = shard_map_per_device(" in code
    assert not any("deleted with" in m or "a def deleted" in m for m in messages)
    assert any("[PL102] `cross_replica_mean`" in m for m in messages)


def test_a_mean_read_by_code_that_stays_stays(project: Path) -> None:
    source = (project / "train.py").read_text()
    source += "\n\ndef report(x):\n    return cross_replica_mean(x)\n"
    code, messages, _ = migrated(project, source)
    assert SYNC not in code  # its calls were the program's alone
    assert "cross_replica_mean = shard_map_per_device(" in code and "def report(x):" in code
    assert not any("deleted with" in m for m in messages)


def test_a_skip_comment_on_a_deletion_keeps_every_deletion_of_its_group(project: Path) -> None:
    source = (project / "train.py").read_text()
    source = source.replace(
        MEAN + 'lambda x: lax.pmean(x, "x"), "x")',
        MEAN + 'lambda x: lax.pmean(x, "x"), "x")  # jaxmigrate: skip',
    )
    assert "# jaxmigrate: skip" in source
    code, messages, _ = migrated(project, source)
    assert SYNC in code and MEAN in code  # both kept, the pmap left as it is
    assert not any("deleted with" in m or "a def deleted" in m for m in messages)
    assert "jax.jit(\n        jax.shard_map(" in code  # the program itself still rewritten


def test_a_pmap_in_a_def_read_nowhere_is_kept_and_said_so(project: Path) -> None:
    """flax lm1b's `per_host_sum_pmap`: unread before the rewrite came, so kept (the rule
    deletes only what its own edits leave unread), and its site says so."""
    source = (project / "train.py").read_text()
    source += (
        "\n\ndef per_host_sum_pmap(x):\n"
        '    host_psum = jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")\n'
        "    return host_psum(x)\n"
    )
    code, messages, _ = migrated(project, source)
    assert "def per_host_sum_pmap(x):" in code
    (said,) = [m for m in messages if "read nowhere" in m]
    assert "`per_host_sum_pmap`, around it, is read nowhere in the code base" in said
    (project / "other.py").write_text("import train\n\ntrain.per_host_sum_pmap(1)\n")
    _, messages, _ = migrated(project, source)
    assert not any("read nowhere" in m for m in messages)


def test_a_text_alone_keeps_its_public_names() -> None:
    source = (PROJECT / "examples" / "imagenet" / "train.py").read_text()
    result = migrate_source(source, options=Options(unsafe_fixes=True))  # no code base around
    assert SYNC in result.code and "cross_replica_mean = shard_map_per_device(" in result.code
    assert not any("deleted" in s.message and "def" in s.message for s in result.sites)


def test_the_returned_copies_are_compared_as_one_only_when_equal() -> None:
    layouts = [{"returns_one": True}]
    new = Flat("t", (("['output'].w", np.ones((4, 2), np.float32)),))
    equal = Flat("t", (("['output'].w", np.ones((8, 4, 2), np.float32)),))
    assert one_copy(layouts, equal, new).leaves[0][1].shape == (4, 2)
    differ = np.ones((8, 4, 2), np.float32)
    differ[3, 0, 0] = 2.0
    unequal = Flat("t", (("['output'].w", differ),))
    assert one_copy(layouts, unequal, new).leaves[0][1].shape == (8, 4, 2)
    assert one_copy([{}], equal, new) is equal  # no step says so: compared as it is
    argument = Flat("t", (("['args'][0]", np.ones((8, 4, 2), np.float32)),))
    assert one_copy(layouts, argument, new).leaves[0][1].shape == (8, 4, 2)


@pytest.mark.jax
def test_the_program_is_written_verified_and_prints_the_same(project: Path, tmp_path: Path) -> None:
    """Run by its `main.py`, every site of the group is verified and written, deletions
    included; the rewritten program prints what the original printed, in one process and in
    each process of a 2-process job."""
    before = run_job(project / "main.py", processes=1, devices=8, cwd=project, timeout=300)
    before_job = run_job(project / "main.py", processes=2, devices=8, cwd=project, timeout=300)
    assert before.ok and before_job.ok, before.describe() + before_job.describe()
    report = tmp_path / "report.json"
    args = ("run", "--no-cache", "--select", "pmap", "--report", str(report))
    proc = jm(*args, "--verify-with", "python main.py", ".", cwd=project, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = [s for f in json.loads(report.read_text())["files"] for s in f["sites"]]
    assert len(sites) == 10, sites
    assert all(s["status"] == "verified" and s["applied"] for s in sites), sites
    assert (project / "train.py").read_text() == EXPECTED.read_text()
    after = run_job(project / "main.py", processes=1, devices=8, cwd=project, timeout=300)
    after_job = run_job(project / "main.py", processes=2, devices=8, cwd=project, timeout=300)
    assert after.ok and after_job.ok, after.describe() + after_job.describe()
    for old, new in ((before, after), (before_job, after_job)):
        assert losses(new.stdouts) == losses(old.stdouts)


def losses(stdouts: list[str]) -> list[list[str]]:
    """The losses each process printed (not the collectives' own lines)."""
    found = [[line for line in out.splitlines() if line.startswith("[Array(")] for out in stdouts]
    assert all(found), stdouts
    return found
