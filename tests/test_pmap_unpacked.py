"""A tuple written out and unpacked, maybe through calls keeping each leaf (brax's
`state, env = _strip_weak_type((state, env))`): each name unpacked is laid out as the name the
tuple holds there, and its reads from there are followed as that name's (the program-level
fixture `program_unpacked_through_helper` runs before and after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

FIXTURE = Path(__file__).parent / "fixtures" / "pmap" / "program_unpacked_through_helper.py"
LOOP = "        state, steps = p_epoch(state, steps, common_utils.shard(x))\n"


def step_message(source: str) -> str:
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    return next(s.message for s in result.sites if s.message.startswith("`jax.pmap` ->"))


def test_the_fixture_takes_the_program_level_form() -> None:
    assert "(program-level)" in step_message(FIXTURE.read_text())


def test_a_name_unpacked_is_read_back_as_the_name_it_holds() -> None:
    """`state["w"][0]` after the unpacking, before the step: device 0's copy of the replication
    it holds, deleted as such, not left to read the first row of the value."""
    source = FIXTURE.read_text().replace(LOOP, '        print(state["w"][0])\n' + LOOP)
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert any(
        s.message.startswith("a readback of device 0 deleted: `state`") for s in result.sites
    )
    assert 'print(state["w"])' in result.code


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        # a result read otherwise once unpacked: its layout is needed there
        ('(state,) = _strip_weak_type((state,))\n        print(state["w"].shape)', "PL303"),
        # a result unpacked into another name: the part is not followed
        ("other, steps = _strip_weak_type((state, steps))\n        print(other)", "PL401"),
        # a starred target: the parts do not line up
        ("state, *rest = _strip_weak_type((state, steps))", "PL301"),
    ],
)
def test_a_name_unpacked_read_otherwise_blocks_by_code(edit: str, code: str) -> None:
    source = FIXTURE.read_text().replace(LOOP, LOOP + "        " + edit + "\n")
    assert f"[{code}]" in step_message(source)
