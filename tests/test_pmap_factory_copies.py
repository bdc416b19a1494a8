"""A parameter every call passes the results of a step another module's factory makes, fed back
(vision_transformer's notebook: `params_repl` from `train.make_update_fn(...)`'s step, passed to
`get_accuracy`), is equal copies when that step's body keeps those results the same on every
device: the parameter is taken as declared (`_survey.kept_copies`). A body that does not keeps
the parameter PL301."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from clitools import jm
from multihost import run_job

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

PROJECT = Path(__file__).parent / "fixtures" / "pmap" / "projects" / "factory_step_fed_back"


def messages(folder: Path) -> list[str]:
    path = folder / "run.py"
    result = migrate_source(path.read_text(), options=Options(unsafe_fixes=True), path=str(path))
    return [s.message for s in result.sites if s.code == "JM202"]


def test_results_the_body_keeps_equal_are_copies() -> None:
    found = messages(PROJECT)
    assert any("(program-level)" in m for m in found), found
    assert any("`params_repl`, a parameter whose callers pass equal copies" in m for m in found)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # the parameters updated with each device's own gradient: they differ between devices
        (
            (
                'grad = jax.lax.pmean(jnp.mean(batch, axis=0) * params, axis_name="batch")',
                "grad = jnp.mean(batch, axis=0) * params",
            ),
            "per-device update",
        ),
        # the key fed back split per device: the parameters then depend on it
        (
            (
                "_, new_rng = jax.random.split(rng)",
                (
                    "new_rng = jax.random.fold_in(rng, jax.lax.axis_index('batch'))\n"
                    "        params = params + jax.random.normal(new_rng, params.shape)"
                ),
            ),
            "per-device key",
        ),
        # another option: the factory's step is not read
        (
            ('axis_name="batch", donate_argnums=(0,)', 'axis_name="batch", in_axes=(0, 0, 0)'),
            "in_axes",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_results_the_body_may_make_differ_are_not(
    tmp_path: Path, change: tuple[str, str], why: str
) -> None:
    folder = tmp_path / "project"
    shutil.copytree(PROJECT, folder)
    lib = folder / "lib.py"
    assert change[0] in lib.read_text(), why
    lib.write_text(lib.read_text().replace(*change))
    found = messages(folder)
    assert not any("(program-level)" in m for m in found), (why, found)
    assert any("[PL301]" in m and "`params_repl`" in m for m in found), (why, found)


@pytest.mark.jax
def test_the_program_is_written_verified(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    shutil.copytree(PROJECT, folder)
    for expected in folder.glob("*.expected.py"):
        expected.unlink()
    report = tmp_path / "report.json"
    proc = jm("run", "--no-cache", "--report", str(report), "run.py", cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(report.read_text())["files"]
    sites = [s for s in entry["sites"] if s["code"] == "JM202"]
    assert sites and all(s["status"] == "verified" and s["applied"] for s in sites), sites
    written = (folder / "run.py").read_text()
    assert written == (PROJECT / "run.expected.py").read_text()


RUN_BOTH = """\
import json, runpy, sys
import jax
import numpy as np
sys.path.insert(0, sys.argv[1])
for name in ("run.py", "run.expected.py"):
    result = runpy.run_path(f"{sys.argv[1]}/{name}", run_name="fixture")["main"]()
    print("RESULT", name, json.dumps(np.asarray(result).tolist()), flush=True)
"""


@pytest.mark.jax
def test_the_program_gives_every_process_the_original_numbers(tmp_path: Path) -> None:
    """The rewrite places `params_repl` (one value at `_evaluate`'s entry) and the batches on
    the job's mesh: run as a 2-process job, each process gets the numbers the original gives."""
    script = tmp_path / "run_both.py"
    script.write_text(RUN_BOTH)
    job = run_job(script, processes=2, devices=8, args=[str(PROJECT)], timeout=300)
    assert job.ok, job.describe()
    for out in job.stdouts:
        shown = dict(
            line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("RESULT ")
        )
        want, got = (json.loads(shown[n]) for n in ("run.py", "run.expected.py"))
        np.testing.assert_allclose(got, want, rtol=1e-6)
