"""The planner's references come from the passes (`Pass.REFERENCE`), in the order tried."""

from __future__ import annotations

import ast

import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.registry import find_pass
from jaxmigrate.verify.planner import ORIGINAL, SAFE_REWRITES, references_for
from jaxmigrate.verify.targets import find_target

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
