"""A program-level pmap group made and called outside any function is verified by running the
module as `python file.py` does.

A script's statements (or its `if __name__ == "__main__":` block) make a step and call it: no
function holds the group, so the unit is the module run as a program. Its run on each side
shows what it prints and writes, and the step's calls are compared through the layout adapters
(the original's brought to the flat layout). In `good.py` the rewrite is right: verified and
written. In `aliased.py` it is wrong, as `two_steps.py`'s `aliased` in
`test_verify_pmap_fallback.py`: the program replicates a numpy array (a copy) and then updates
the array in place, through a dict holding it (the analysis follows `w`, not every reference to
its value), so deleting the replication passes the step the update; the step's first
call differs, the program-level form fails and the faithful form is written. `main_block.py`
is JAX's spmd_mnist example's shape, its only output a printed line. Real JAX on 8 simulated
CPU devices, real subprocesses.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from clitools import committed, jm, run_with_report

pytestmark = pytest.mark.jax

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pmap"
ALIASED = textwrap.dedent(
    """\
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax.training import common_utils


    @functools.partial(jax.pmap, axis_name="batch")
    def step(w, batch):
        grads = jax.lax.pmean(jnp.mean(batch) * w, axis_name="batch")
        return w - 0.1 * grads, jax.lax.pmean(jnp.sum(w), axis_name="batch")


    n = jax.local_device_count()
    host = {"w": np.zeros(3, np.float32)}  # updated in place through this dict below
    w = host["w"]
    params = jnp.broadcast_to(w, (n,) + w.shape)  # a copy: the update below is not the step's
    host["w"] += 1.0
    for i in range(2):
        params, total = step(params, common_utils.shard(np.arange(16, dtype=np.float32) + i))
    print("total", float(total[0]))
    """
)


def test_a_scripts_program_is_verified_by_running_the_script(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "program_module_level_script.py", tmp_path / "good.py")
    shutil.copyfile(FIXTURES / "program_main_block_generator.py", tmp_path / "main_block.py")
    (tmp_path / "aliased.py").write_text(ALIASED)
    committed(tmp_path)
    _, report = run_with_report(tmp_path, ".", "--timeout", "300")
    files = {Path(f["path"]).name: f["sites"] for f in report["files"]}
    for name, count in (("good.py", 5), ("main_block.py", 6)):
        sites = files[name]
        assert len(sites) == count, sites
        assert all(s["status"] == "verified" and s["applied"] for s in sites), sites
        (reason,) = {s["details"]["verification"] for s in sites}  # one unit for the group
        assert f"agrees with the original when `python {name}` runs" in reason
        assert "3 call(s) of its step in the flat layout" in reason, reason
        assert "(program-level)" in " ".join(s["message"] for s in sites)
    shown = next(s for s in files["main_block.py"] if "(program-level)" in s["message"])
    assert shown["details"]["compared"]["printed"] == 1
    good = (tmp_path / "good.py").read_text()
    assert "replicate" not in good and "shard(" not in good and "jax.pmap" not in good
    (step,) = files["aliased.py"]
    assert step["status"] == "verified" and step["applied"], step
    assert "[PL603] program-level form failed verification (outputs differ" in step["message"]
    assert "shard_map_per_device" in (tmp_path / "aliased.py").read_text()
    failed = step["details"]["program_level"]  # the step's first call: the array updated
    assert failed["status"] == "failed", failed
    assert "['step calls (flat layout)'][0]['arguments'][0]" in failed["reason"], failed


def test_a_scripts_program_is_verified_as_a_two_process_job(tmp_path: Path) -> None:
    """Each process runs the script; what each prints is compared (gloo's log of its
    connections, printed by the runtime on whichever side connects first, is not the
    program's)."""
    text = (FIXTURES / "program_module_level_script.py").read_text()
    (tmp_path / "train.py").write_text(text + '\n\nif __name__ == "__main__":\n    print(final)\n')
    report = tmp_path.parent / "report.json"
    proc = jm(
        *("run", "--dry-run", "--no-cache", "--processes", "2", "train.py"),
        *("--timeout", "300", "--report", str(report), "--format", "json"),
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(report.read_text())["files"]
    assert len(entry["sites"]) == 5
    for site in entry["sites"]:
        assert site["status"] == "verified", site
        reason = site["details"]["verification"]
        assert "when `python train.py` runs (compared: 1 printed line(s))" in reason, reason
