"""A `pmap-replicated` declaration is the project's word, and verification holds it to it.

`[tool.jaxmigrate] pmap-replicated = ["evaluate(params)"]` says every caller of `evaluate` passes
`params` as equal copies, one per local device; the program-level form then takes device 0's
copy at the entry of `evaluate`. Here the module's own `main()` passes copies that differ (a
batch, in effect): verification runs the original, sees argument 1 of the step differ between
devices, fails the program-level form (PL603) and writes the faithful form, which keeps every
device's copy. With copies that are equal, the same declaration is verified and written. Real
JAX on 8 simulated CPU devices, real subprocesses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import committed, run_with_report

pytestmark = pytest.mark.jax

PROGRAM = """\
import jax
import numpy as np


def step(w, x):
    return jax.lax.psum((w * x).sum(), "i")


p_step = jax.pmap(step, axis_name="i")


def evaluate(params):
    n = jax.local_device_count()
    x = np.arange(n * 6, dtype=np.float32).reshape(-1, 3)
    batch = x.reshape((n, -1) + x.shape[1:])
    return p_step(params, batch)[0]


def main():
    n = jax.local_device_count()
    params = {params}
    return np.asarray(evaluate(params))
"""
DIFFERING = "np.arange(n * 3, dtype=np.float32).reshape(n, 3)  # a batch, not copies"
EQUAL = "np.broadcast_to(np.ones(3, np.float32), (n, 3))  # copies of one value"


@pytest.mark.parametrize(
    ("params", "declared_right"), [(DIFFERING, False), (EQUAL, True)], ids=["differ", "equal"]
)
def test_verification_holds_a_declaration_to_what_the_program_passes(
    tmp_path: Path, params: str, declared_right: bool
) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM.format(params=params))
    (tmp_path / "pyproject.toml").write_text(
        '[tool.jaxmigrate]\npmap-replicated = ["evaluate(params)"]\n'
    )
    committed(tmp_path)
    _, report = run_with_report(tmp_path, "prog.py", "--select", "pmap", timeout=600)
    (file,) = [f for f in report["files"] if f["path"] == "prog.py"]
    (site,) = [s for s in file["sites"] if s["message"].startswith("`jax.pmap` ->")]
    written = (tmp_path / "prog.py").read_text()
    assert site["status"] == "verified" and site["applied"], site
    if declared_right:
        assert "(program-level)" in site["message"], site["message"]
        assert "params = from_device_copies(params)" in written
    else:
        assert "[PL603] program-level form failed verification (argument 1 of " in site["message"]
        assert "differs between devices in the original" in site["message"]
        assert "from_device_copies" not in written and "shard_map_per_device(" in written
