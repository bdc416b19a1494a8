"""When the program-level pmap form is not taken, and why: the faithful form with the reason.

The positive cases run as fixture pairs (tests/fixtures/pmap/program_*.py, executed on 8 CPU
devices); these are the shapes the analysis must refuse, checked through the real engine.
"""

from __future__ import annotations

import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

HEAD = """\
import jax
import jax.numpy as jnp


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i")


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
"""

REFUSED = {
    "returned stacked": ("    w = p_step(w, x)\n    return w\n", "read other than"),
    "called in a nested def": (
        "    def later():\n        out = p_step(w, x)\n        return out[0]\n\n    return later()\n",
        "nested function",
    ),
    "called in a lambda": ("    f = lambda: p_step(w, x)\n    return f()[0]\n", "called other"),
    "handed to other code": ("    return run(p_step, w, x)\n", "used other than called"),
    "read as a whole": ("    out = p_step(w, x)\n    return out.sum()\n", "read other than"),
    "argument from a parameter": (
        "    w = p_step(w, x)\n    v = p_step(w, y)\n    return v[0]\n",
        "not visible",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_shapes_keep_the_faithful_form_and_say_why(case: str) -> None:
    tail, why = REFUSED[case]
    result = migrate_source(HEAD + tail, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code
    (site,) = result.sites
    assert "program-level form not taken" in site.message and why in site.message, site.message


def test_the_same_flow_taken_when_fully_visible() -> None:
    code = HEAD + "    w = p_step(w, x)\n    return w[0]\n"
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "jax.shard_map(" in result.code
    assert "return w\n" in result.code
    assert len({s.group for s in result.sites}) == 1 and len(result.sites) == 4


def test_faithful_style_never_takes_it() -> None:
    code = HEAD + "    w = p_step(w, x)\n    return w[0]\n"
    result = migrate_source(code, options=Options(unsafe_fixes=True, pmap_style="faithful"))
    assert "shard_map_per_device(" in result.code
    assert "program-level" not in result.sites[0].message


def test_a_group_is_written_whole_or_not_at_all() -> None:
    code = HEAD + "    w = p_step(w, x)\n    return w[0]\n"

    def refuse_the_readback(sites):
        return [
            s if "readback" not in s.message else type(s)(**{**vars(s), "applied": False})
            for s in sites
        ]

    result = migrate_source(code, options=Options(unsafe_fixes=True), accept=refuse_the_readback)
    assert result.code == code
    assert not any(s.applied for s in result.sites)
