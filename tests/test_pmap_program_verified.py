"""`jaxmigrate run` verifies the program-level form of steps made outside the function calling
them, and writes it.

A step made at module level (`p_train_step = jax.pmap(...)`, `@jax.pmap def predict`) or stored
on `self` takes the flat layout its program passes, on the mesh its program sets. The verifier
used to call it alone, on pmap's stacked inputs and with no mesh set: the rewrite raised ("The
context mesh cannot be empty"), so the whole group fell back to the faithful form (PL603) on
every such program. Its sites are now judged through the module's `main()` running the program
(the step's calls compared in the flat layout), and the rewrite's module-level step is captured
at import.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from clitools import jm

pytestmark = pytest.mark.jax

FIXTURES = Path(__file__).parent / "fixtures" / "pmap"
CASES = {
    # name: the step calls compared in the flat layout (a stored step's are not captured)
    "program_module_step": True,
    "program_drawn_batches_transformed": True,
    "program_stored_lambda_step": False,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_step_made_outside_its_program_is_verified_through_main(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / f"{name}.py"
    shutil.copy(FIXTURES / f"{name}.py", path)
    proc = jm("run", "--no-cache", "--target-jax", "0.8", path.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sites = [line for line in proc.stdout.splitlines() if line.startswith(f"{name}.py:")]
    assert sites and all("[unsafe, verified]" in s and "(applied)" in s for s in sites), proc.stdout
    assert not any("PL603" in s for s in sites), proc.stdout
    assert any("(program-level)" in s for s in sites), proc.stdout
    agrees = [line for line in proc.stdout.splitlines() if "agrees with the original when" in line]
    assert agrees and all("`main()` runs (compared: its return value" in a for a in agrees)
    assert all(("call(s) of its step in the flat layout" in a) == CASES[name] for a in agrees)
    assert path.read_text() == (FIXTURES / f"{name}.expected.py").read_text()
