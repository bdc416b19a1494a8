"""The planner's references come from the passes (`Pass.REFERENCE`), in the order tried."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.registry import find_pass
from jaxmigrate.verify.child.protocol import SCRIPT
from jaxmigrate.verify.config import VerifyRequest
from jaxmigrate.verify.planner import (
    ORIGINAL,
    SAFE_REWRITES,
    plan_file,
    reach_spans,
    references_for,
)
from jaxmigrate.verify.targets import Kind, find_target

PMAP = "import jax\n\n\ndef step(x):\n    return jax.pmap(lambda v: v * 2)(x)\n"
WITH_MESH = (
    "import jax\nimport numpy as np\nfrom jax.sharding import Mesh, PartitionSpec as P\n\n\n"
    "def step(x):\n    mesh = Mesh(np.array(jax.devices()), ('x',))\n    with mesh:\n"
    "        return jax.jit(lambda v: v * 2, in_shardings=P('x'))(x)\n"
)


@pytest.mark.parametrize("source", [PMAP, WITH_MESH], ids=["pmap", "with-mesh"])
def test_a_sites_reference_is_its_passes(source: str) -> None:
    sites = migrate_source(source, options=Options(unsafe_fixes=True)).sites
    assert sites
    target = find_target(ast.parse(source), sites[0].line)
    wanted = find_pass(sites[0].name).REFERENCE
    assert wanted is not None
    assert references_for(sites, target, "", baseline=False) == (ORIGINAL, wanted)
    with_baseline = references_for(sites, target, "", baseline=True)
    assert with_baseline == (ORIGINAL, wanted, SAFE_REWRITES, f"{SAFE_REWRITES}+{wanted}")


def test_a_pass_without_a_reference_adds_none() -> None:
    source = "from jax.experimental.maps import Mesh\n\n\ndef f():\n    return Mesh\n"
    sites = migrate_source(source).sites
    assert [s.name for s in sites] == ["legacy-imports"]
    assert find_pass("legacy-imports").REFERENCE is None
    target = find_target(ast.parse(source), 5)
    assert references_for(sites, target, "", baseline=False) == (ORIGINAL,)


SCRIPT_SOURCE = (
    Path(__file__).resolve().parent.parent / "fixtures" / "pmap" / "program_module_level_script.py"
).read_text()


def test_a_program_made_and_called_outside_functions_is_verified_by_running_the_script(
    tmp_path: Path,
) -> None:
    """A script's program-level group (its step site's layout says `script`) is one plan whose
    target is the module run as a program; a notebook's too (its cells as one script), not
    bound to its command's recorded calls."""
    result = migrate_source(SCRIPT_SOURCE, options=Options(unsafe_fixes=True))
    program = [s for s in result.sites if s.group is not None]
    assert len(program) == 5 and any(s.details.get("layout", {}).get("script") for s in program)
    request = VerifyRequest("train.py", SCRIPT_SOURCE, result.code, tuple(result.sites))
    plans, verdicts = plan_file(request, tmp_path, 0)
    (plan,) = [p for p in plans if p.target.qualname == SCRIPT]
    assert plan.target.kind is Kind.FUNCTION and set(plan.sites) == set(program)
    assert not verdicts  # no site is left unverified for want of a function to run
    spans = reach_spans(plan)  # each site's lines must run when the script does
    assert len(spans) == len({s.line for s in program})
    notebook = replace(request, command="python cells.py")
    plans, _ = plan_file(notebook, tmp_path, 0)
    assert [p.target.qualname for p in plans] == [SCRIPT]
