"""Verification wired to passes and to git: rounds, re-decided files, `verify --against`.

A toy unsafe pass inlines `double(e)` as `e * 2` but forgets parentheses, so it is right for
`double(x)` and wrong for `double(x + 1)`: the verifier must keep the first and refuse the second.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import libcst as cst
import pytest
from clitools import git, jm

from jaxmigrate.model import Bucket, FileResult, Options, Safety, Status
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.toolkit.passes import Pass
from jaxmigrate.verify import VerifyConfig, verify_against, verify_results

pytestmark = pytest.mark.jax


class InlineDouble(Pass):
    """Inline `double(e)` as `e * 2` (without parentheses: wrong for `double(a + b)`)."""

    NAME: ClassVar[str] = "inline-double"
    CODE: ClassVar[str] = "JM901"
    SAFETY: ClassVar[Safety] = Safety.UNSAFE
    TRIGGER: ClassVar[re.Pattern[str]] = re.compile(r"\bdouble\(")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if isinstance(func, cst.Name) and func.value == "double" and self.site(original_node, "x"):
            return cst.BinaryOperation(
                left=updated_node.args[0].value, operator=cst.Multiply(), right=cst.Integer("2")
            )
        return updated_node


SOURCE = textwrap.dedent("""
    import jax.numpy as jnp


    def double(x):
        return x * 2


    def right(x):
        return jnp.tanh(double(x)) + 1


    def wrong(x):
        return jnp.tanh(double(x + 1))
    """)


def test_a_failed_site_is_dropped_and_the_rest_reverified(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(SOURCE)
    migration = migrate_source(SOURCE, passes=(InlineDouble,), options=Options())
    result = FileResult(
        str(tmp_path / "mod.py"),
        Bucket.CHANGED,
        sites=migration.sites,
        old_text=SOURCE,
        new_text=migration.code,
    )
    config = VerifyConfig(root=tmp_path, timeout=60.0, jobs=1)
    (out,) = verify_results([result], Options(), config, passes=(InlineDouble,))
    by_line = {s.line: s for s in out.sites}
    right, wrong = by_line[10], by_line[14]
    assert wrong.status is Status.FAILED and not wrong.applied
    assert "outputs differ" in wrong.details["verification"]
    assert right.status is Status.VERIFIED and right.applied
    assert right.details["round"] == 2, "the survivor is verified again without the failed site"
    assert out.new_text is not None
    assert "jnp.tanh(x * 2) + 1" in out.new_text and "double(x + 1)" in out.new_text
    assert out.bucket is Bucket.CHANGED
    assert (tmp_path / "mod.py").read_text() == SOURCE


LEGACY = textwrap.dedent("""
        from functools import partial

        import jax
        from jax import lax


        @partial(jax.pmap, axis_name="i")
        def good(x):
            return x / x.shape[0] + lax.psum(x, "i")


        @partial(jax.pmap, axis_name="i")
        def bad(x):
            return x / x.shape[0]


        def untouched(x):
            return x
        """)

BY_HAND = textwrap.dedent("""
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jax import lax
        from jax.sharding import Mesh, PartitionSpec as P

        mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


        def _good(x):
            x = jnp.squeeze(x, 0)
            return jnp.expand_dims(x / x.shape[0] + lax.psum(x, "i"), 0)


        good = jax.jit(jax.shard_map(_good, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        bad = jax.jit(jax.shard_map(lambda x: x / x.shape[0], mesh=mesh, in_specs=P("i"),
                                    out_specs=P("i")))


        def untouched(x):
            return x
        """)


@pytest.fixture
def migrated_by_hand(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(LEGACY)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "legacy")
    (tmp_path / "train.py").write_text(BY_HAND)
    return tmp_path


def test_verify_against_a_revision(migrated_by_hand: Path) -> None:
    config = VerifyConfig(root=migrated_by_hand, timeout=60.0, jobs=1)
    verdicts = verify_against("HEAD", [], config)
    assert set(verdicts) == {("train.py", "changed:good"), ("train.py", "changed:bad")}
    assert verdicts[("train.py", "changed:good")].status is Status.VERIFIED
    bad = verdicts[("train.py", "changed:bad")]
    assert bad.status is Status.FAILED and "values differ" in bad.reason


def jaxmigrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return jm(*args, cwd=cwd, timeout=900)


def test_the_verify_command_exits_1_on_a_failure_and_reports(migrated_by_hand: Path) -> None:
    proc = jaxmigrate("verify", "--against", "HEAD", "--report", "out.json", cwd=migrated_by_hand)
    assert proc.returncode == 1, proc.stderr
    assert "train.py:13:1 JM000 hand-migration [unsafe, failed] `bad` changed" in proc.stdout
    assert "2 changed definition(s): 1 verified, 1 failed" in proc.stdout
    report = json.loads((migrated_by_hand / "out.json").read_text())
    sites = {s["message"]: s for f in report["files"] for s in f["sites"]}
    bad = sites["`bad` changed since HEAD"]
    assert bad["status"] == "failed" and bad["details"]["mismatch"]["path"] == "output"
    assert bad["details"]["input_source"] == "synthesized"
    assert bad["details"]["reference"] == "original"


def test_the_verify_command_exits_2_on_an_unknown_revision(migrated_by_hand: Path) -> None:
    proc = jaxmigrate("verify", "--against", "no-such-rev", cwd=migrated_by_hand)
    assert proc.returncode == 2
    assert "error:" in proc.stderr


def test_the_parent_process_never_imports_jax() -> None:
    code = (
        "import sys; import jaxmigrate.verify, jaxmigrate.verify.session;"
        "assert not {'jax', 'numpy'} & set(sys.modules), sorted(sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
