"""When the program-level pmap form fails verification, the faithful form is written instead.

Per step, not per file: `tests/data/pmap_fallback/two_steps.py` makes the same step in two
functions. In `good` the program-level form is right and is kept. In `aliased` it is wrong: the
program replicates a numpy array (`jnp.broadcast_to` copies it) and then updates the array in
place, through the module's dict holding it; deleting the replication passes the array itself,
so the step sees the update. The analysis cannot see that (it follows the names the step is
given, `w`, and their in-place changes, not every reference to their values); verification
does, and the faithful form, which keeps the replication, verifies. Real JAX on 8 simulated CPU devices, real subprocesses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from clitools import committed, git, jm, run_with_report
from conftest import jax_env

from jaxmigrate.model import Bucket, FileResult, Options, Safety, Site, Status
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.verify import Verdict, VerifyConfig, verify_results
from jaxmigrate.verify.child.protocol import Ran
from jaxmigrate.verify.judge import layout_verdict
from jaxmigrate.verify.notebooks import program
from jaxmigrate.verify.pool import combine
from jaxmigrate.verify.results import failed_forms, short

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

DATA = Path(__file__).resolve().parent.parent / "data" / "pmap_fallback"
TWO_STEPS = (DATA / "two_steps.py").read_text()
GOOD, ALIASED, LOGGED = (f"JM202:program:{line}:14" for line in (14, 25, 39))  # steps' groups
FAILED_NOTE = "program-level form failed verification ("


def test_a_step_asked_for_its_fallback_is_faithful_and_the_other_stays_program_level() -> None:
    result = migrate_source(
        TWO_STEPS, options=Options(unsafe_fixes=True), fallbacks={ALIASED: "outputs differ"}
    )
    aliased = [s for s in result.sites if 22 <= s.line < 34]
    good = [s for s in result.sites if s.line < 22]
    logged = [s for s in result.sites if s.line >= 34]
    assert len(good) == 5 and {s.group for s in good} == {GOOD}
    assert all(s.fallback == GOOD for s in good)
    assert len(logged) == 5 and {s.fallback for s in logged} == {LOGGED}
    (step,) = aliased
    assert step.group is None and step.fallback == ALIASED
    assert step.message.endswith("program-level form failed verification (outputs differ)")
    assert "shard_map_per_device(\n        step" in result.code  # the aliased step
    assert result.code.count('jax.sharding.Mesh(jax.devices(), ("batch",))') == 2  # the others
    assert 'params = jnp.broadcast_to(w, (n,) + w.shape)\n    HOST["aliased"] += 1.0' in result.code


def site(key: str, status: Status, group: str | None, reason: str = "why") -> Site:
    return Site(
        "JM202",
        "pmap",
        1,
        1,
        Safety.UNSAFE,
        "m",
        key,
        group=group,
        status=status,
        fallback="F" if group else None,
        details={"verification": reason},
    )


def test_only_a_failed_group_asks_for_its_fallback() -> None:
    assert failed_forms([site("a", Status.FAILED, "F", "outputs differ")]) == {
        "F": "outputs differ"
    }
    # unverified: nothing to compare against, and the faithful form has the same target and inputs
    assert failed_forms([site("a", Status.UNVERIFIED, "F")]) == {}
    assert failed_forms([site("a", Status.VERIFIED, "F")]) == {}
    # a site already written in its fallback form (no group) never asks again
    assert failed_forms([site("a", Status.FAILED, None)]) == {}
    assert short("x" * 300).endswith("...") and len(short("x" * 300)) == 120
    assert short("first line\nsecond") == "first line"


@pytest.mark.jax
def test_run_writes_the_faithful_form_where_the_program_level_one_failed(tmp_path: Path) -> None:
    for name in ("two_steps.py", "predictions.py"):
        shutil.copyfile(DATA / name, tmp_path / name)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "two_steps.py", "predictions.py")
    git(tmp_path, "commit", "-qm", "pmap")
    report = tmp_path.parent / "report.json"
    proc = jm(
        *("run", "two_steps.py", "predictions.py", "--timeout", "300"),
        *("--report", str(report), "--format", "json"),
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {Path(f["path"]).name: f for f in json.loads(report.read_text())["files"]}
    predictions = files["predictions.py"]["sites"]
    assert len(predictions) == 5
    assert all(s["status"] == "verified" and s["applied"] for s in predictions), predictions
    assert "program-level" in predictions[0]["message"] + predictions[1]["message"]
    entry = files["two_steps.py"]
    sites = {(s["line"], s["col"]): s for s in entry["sites"]}
    good = [s for (line, _), s in sites.items() if line < 22]
    assert len(good) == 5 and all(s["status"] == "verified" and s["applied"] for s in good)
    assert "program-level" in sites[(14, 14)]["message"]
    faithful, logged = [s for (line, _), s in sites.items() if line >= 22]
    for site in (faithful, logged):
        assert site["status"] == "verified" and site["applied"]
        assert FAILED_NOTE + "outputs differ" in site["message"]
        assert site["message"].endswith(": faithful form written")
    first = faithful["details"]["program_level"]
    assert first["status"] == "failed" and "outputs differ" in first["reason"]
    # `logged` returns nothing: its step's calls, in the flat layout, show the difference
    # (argument 1 of call 1: the array updated in place, not the copy replicated before).
    why = logged["details"]["program_level"]["reason"]
    assert "['step calls (flat layout)'][0]['arguments'][0]" in why
    assert FAILED_NOTE + "outputs differ" in proc.stdout.replace("\n", " ")
    written = (tmp_path / "two_steps.py").read_text()
    assert written.count("jax.shard_map(") == 1 and written.count("shard_map_per_device(") == 2
    assert (tmp_path / "_pmap_compat.py").exists()
    # The written program computes what the original did, in both functions.
    check = textwrap.dedent("""
        import importlib.util, sys
        import numpy as np
        def load(name, path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        old, new = load("old", sys.argv[1]), load("new", "two_steps.py")
        for name in ("good", "aliased"):
            for a, b in zip(getattr(old, name)(), getattr(new, name)()):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
        print("same")
        """)
    original = tmp_path.parent / "original_two_steps.py"
    shutil.copyfile(DATA / "two_steps.py", original)
    ran = subprocess.run(
        [sys.executable, "-c", check, str(original)],
        check=False,
        cwd=tmp_path,
        env=jax_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.stdout.strip() == "same", ran.stderr


@pytest.mark.jax
def test_a_notebooks_failed_program_falls_back_to_the_faithful_form_verified_in_its_cells(
    tmp_path: Path,
) -> None:
    """`aliased_cells.ipynb` is `aliased` made and called in a notebook's cells (the module-level
    program, verified by running the cells as one script): the program-level form fails there as
    in a function, and the notebook is migrated again with that step faithful, its cells run
    again, verified and written, as a Python file's would be."""
    path = tmp_path / "aliased.ipynb"
    shutil.copyfile(DATA / "aliased_cells.ipynb", path)
    committed(tmp_path)
    _, report = run_with_report(tmp_path, ".")
    (step,) = report["files"][0]["sites"]
    assert step["status"] == "verified" and step["applied"], step
    assert "[PL603] " + FAILED_NOTE + "outputs differ" in step["message"]
    assert step["message"].endswith(": faithful form written")
    assert "its code cells, in order" in step["details"]["verification"]
    assert step["details"]["program_level"]["status"] == "failed"
    written = json.loads(path.read_text())["cells"]
    cells = ["".join(c["source"]) for c in written]
    assert "jax.pmap(" not in cells[2] and "shard_map_per_device(" in cells[2]
    assert 'params = jnp.broadcast_to(w, (n,) + w.shape)\nHOST["w"] += 1.0' in cells[2]

    # The written cells print what the original's did: params halved from w before it moved on.
    def printed(text: str) -> str:
        script = tmp_path / "cells.py"
        script.write_text(program(text).code)
        ran = subprocess.run(
            [sys.executable, str(script)],
            check=True,
            cwd=tmp_path,
            env=jax_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        return ran.stdout

    before = printed((DATA / "aliased_cells.ipynb").read_text())
    assert before == printed(path.read_text()) and before.startswith("[0.5 0.5 0.5]"), before


NONDETERMINISTIC = """\
import os

import jax
import jax.numpy as jnp
import numpy as np


def step(params, x):
    drift = float(os.getpid())  # differs between the processes that run it, in either form
    loss = jax.lax.pmean(jnp.mean(x) * jnp.sum(params), axis_name="batch")
    return params * 0.5 + drift, loss


def main():
    n = jax.local_device_count()
    w = np.ones((3,), np.float32)
    p_step = jax.pmap(step, axis_name="batch")
    params = jnp.broadcast_to(w, (n,) + w.shape)
    x = np.arange(8 * 4, dtype=np.float32)
    x = x.reshape((n, -1) + x.shape[1:])
    params, loss = p_step(params, x)
    return params[0], loss[0]
"""


@pytest.mark.jax
def test_when_the_faithful_form_fails_too_nothing_is_written_with_both_reasons(
    tmp_path: Path,
) -> None:
    path = tmp_path / "drift.py"
    path.write_text(NONDETERMINISTIC)
    migration = migrate_source(NONDETERMINISTIC, options=Options(unsafe_fixes=True))
    assert len(migration.sites) == 5  # the program-level form and its four edits
    result = FileResult(
        str(path),
        Bucket.CHANGED,
        migration.sites,
        old_text=NONDETERMINISTIC,
        new_text=migration.code,
    )
    config = VerifyConfig(root=tmp_path, timeout=300.0, jobs=1)
    (out,) = verify_results([result], Options(unsafe_fixes=True), config)
    (step,) = out.sites
    assert step.status is Status.FAILED and not step.applied
    assert FAILED_NOTE + "outputs differ" in step.message
    assert "; the faithful form failed too (outputs differ" in step.message
    assert step.message.endswith("): nothing written")
    assert step.details["program_level"]["status"] == "failed"
    assert out.new_text == NONDETERMINISTIC and out.bucket is Bucket.UNCHANGED


def test_the_step_site_says_what_the_program_level_form_assumes() -> None:
    result = migrate_source(TWO_STEPS, options=Options(unsafe_fixes=True))
    step = next(s for s in result.sites if s.key == "JM202:14:14")
    layout = {
        "line": 14,
        "end_line": 14,
        "body": "step",
        "args": ["replicated", "batch"],
        "keywords": [],
        "replicated": [0],
        "results": [0, 1],
        "varying": [False, False],
        "tuple": True,
        "static_tail": False,  # no `*args` tail passed to `static_argnums`
        "script": False,  # made in a function: that function is the unit
        "returns_one": False,  # no `return state` the rewrite leaves unstacked
    }
    assert step.details["layout"] == layout
    with_layout = {s.key for s in result.sites if "layout" in s.details}
    assert with_layout == {"JM202:14:14", "JM202:25:14", "JM202:39:14"}  # steps, not edits


@pytest.mark.jax
def test_a_result_that_differs_between_devices_makes_the_step_faithful(tmp_path: Path) -> None:
    """`rank_helper.py`: the step's first result is `w + axis_index` through a helper of another
    module (`rank_shift.py`), which the analysis does not read, so it is taken as replicated. Its outputs happen to agree (on one
    process a `P()` result keeps each device's own buffer), but the original shows it differs
    between devices: the site fails and the faithful form is written."""
    text = (DATA / "rank_helper.py").read_text()
    path = tmp_path / "rank_helper.py"
    path.write_text(text)
    (tmp_path / "rank_shift.py").write_text((DATA / "rank_shift.py").read_text())
    migration = migrate_source(text, options=Options())
    result = FileResult(str(path), Bucket.CHANGED, migration.sites, old_text=text)
    config = VerifyConfig(root=tmp_path, timeout=300.0, jobs=1)
    (out,) = verify_results([result], Options(), config)
    (step,) = out.sites
    assert step.status is Status.VERIFIED and step.applied, step.details
    first = step.details["program_level"]["reason"]
    assert first.startswith("result 1 of `jax.pmap(step)` differs between devices in the original")
    assert FAILED_NOTE + "result 1 of `jax.pmap(step)` differs" in step.message
    assert "shard_map_per_device(" in (out.new_text or "")


CHECK_ARGUMENTS = """\
import jax
import jax.numpy as jnp

from jaxmigrate.verify.child.layouts import checked

step = jax.pmap(lambda w, x: (w * 2, jax.lax.psum(x, "i")), axis_name="i")
layout = {"replicated": [0], "results": [0, 1], "tuple": True}
found = []
run = checked(step, layout, "p", found)
n = jax.local_device_count()
run(jnp.stack([jnp.ones(3)] * n), jnp.ones((n, 2)))
print(found)
run(jnp.arange(n * 3.0).reshape(n, 3), jnp.ones((n, 2)))
print(found)
"""


@pytest.mark.jax
def test_an_argument_passed_replicated_must_be_the_same_on_every_device() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", CHECK_ARGUMENTS],
        check=False,
        env=jax_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    clean, caught = ran.stdout.strip().splitlines()
    assert clean == "[]", ran.stderr
    assert "argument 1 of `p` differs between devices in the original (call 2)" in caught


def test_a_broken_assumption_in_any_process_of_a_job_fails_the_site() -> None:
    ran = Ran(reference="original", source="run", calls=1)
    broken = replace(ran, layout_violations=["result 1 of `jax.pmap(step)` differs"])
    combined = combine("original", [ran, broken]).message
    assert isinstance(combined, Ran) and combined.layout_violations == [
        "result 1 of `jax.pmap(step)` differs [process 1 of 2]"
    ]
    agreed = Verdict(Status.VERIFIED, "agrees with the original on 1 call(s)")
    verdict = layout_verdict(agreed, combined)
    assert verdict.status is Status.FAILED and verdict.reason.startswith("result 1 of")
    assert layout_verdict(agreed, ran) is agreed


def test_the_review_renders_a_file_in_the_fallback_forms_verification_chose() -> None:
    from jaxmigrate.review.session import render

    fallbacks = {ALIASED: "outputs differ"}
    migration = migrate_source(TWO_STEPS, options=Options(), fallbacks=fallbacks)
    result = FileResult(
        "two_steps.py", Bucket.CHANGED, migration.sites, old_text=TWO_STEPS, fallbacks=fallbacks
    )
    faithful = next(s for s in migration.sites if s.fallback == ALIASED)
    text = render(result, frozenset({faithful.key}), Options())
    assert text.count("p_step = shard_map_per_device(") == 1 and text.count("jax.pmap(step") == 2
