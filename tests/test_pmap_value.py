"""`jax.pmap` kept as a value (`t = jax.pmap if parallel else jax.vmap`): rewritten only when
every use of `t` in its function is a call `t(f, axis_name="a")` with one literal `a`; anywhere
the value may go elsewhere it is skipped with the reason. The rewrite itself is executed on 8
devices by tests/fixtures/pmap/pmap_as_value.py."""

from __future__ import annotations

import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

SOURCE = """\
import jax


def f(x):
    return x - jax.lax.pmean(x, "i")


def run(x, parallel):
    t = jax.pmap if parallel else jax.vmap
{uses}
"""

TAKEN = "    return t(f, axis_name='i')(x)"
REFUSED = {
    "returned": "    return t",
    "handed to other code": "    return apply(t, f)",
    "two axis names": "    return t(f, axis_name='i')(x), t(f, axis_name='j')(x)",
    "a computed axis name": "    a = 'i'\n    return t(f, axis_name=a)(x)",
    "other arguments": "    return t(f, axis_name='i', in_axes=0)(x)",
    "a positional axis name (vmap's in_axes)": "    return t(f, 'i')(x)",
    "rebound": "    t = jax.jit\n    return t(f, axis_name='i')(x)",
}


def test_called_only_with_one_axis_name_becomes_the_helper_partially_applied() -> None:
    result = migrate_source(SOURCE.format(uses=TAKEN), options=Options(unsafe_fixes=True))
    assert "shard_map_per_device, in_specs=P('i'), out_specs=P('i')" in result.code
    assert [s.message for s in result.sites if "kept as a value" in s.message]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_that_may_go_elsewhere_is_skipped(case: str) -> None:
    source = SOURCE.format(uses=REFUSED[case])
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert result.code == source
    assert [s.reason for s in result.skips] == [
        "`jax.pmap` passed around as a value: the calls made with it are not visible"
    ]
