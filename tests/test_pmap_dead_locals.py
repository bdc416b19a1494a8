"""`_dead.drop_dead_locals`: what a program-level rewrite leaves unread goes, and only that."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemods.pmap._dead import drop_dead_locals

BEFORE = textwrap.dedent("""
    import jax

    PREFIX = (8, 2)


    def stream(data, n):
        for x in data:
            rows = x.shape[0] // n
            # the device axis
            prefix = (n, rows)
            count = int(n)
            shape = {binding}
            x = x.reshape(prefix + x.shape[1:], count, shape)
            yield x
    """)
SPLIT = "        x = x.reshape(prefix + x.shape[1:], count, shape)\n"


def dropped(binding: str = "x.shape[1:]") -> str:
    before = BEFORE.format(binding=binding)
    after = before.replace(SPLIT, "")
    return drop_dead_locals(cst.parse_module(before), cst.parse_module(after)).code


def test_a_pure_value_only_the_deleted_split_read_goes_with_its_comment() -> None:
    code = dropped()
    assert "prefix = (n, rows)" not in code and "# the device axis" not in code, code
    assert "shape = x.shape[1:]" not in code, code  # attributes and items of names: no call
    assert "rows = x.shape[0] // n" in code, code  # read by `prefix` when the pass looked
    assert "PREFIX = (8, 2)" in code, code  # module level: another module may import it


@pytest.mark.parametrize("binding", ["jnp.shape(x)", "x.reshape(-1)[0]", "[x.f() for x in n]"])
def test_a_value_with_a_call_stays(binding: str) -> None:
    code = dropped(binding)
    assert f"shape = {binding}" in code, code
    assert "count = int(n)" in code, code


def test_a_name_bound_twice_stays() -> None:
    before = BEFORE.format(binding="x.shape[1:]").replace(
        "        count = int(n)\n",
        "        count = int(n)\n        prefix = (rows, n)\n",
    )
    after = before.replace(SPLIT, "")
    code = drop_dead_locals(cst.parse_module(before), cst.parse_module(after)).code
    assert "prefix = (n, rows)" in code and "prefix = (rows, n)" in code, code


def test_a_del_of_dead_names_alone_goes_with_them() -> None:
    """`del prefix` after the split: kept without its assignment, it raises
    `UnboundLocalError`."""
    before = BEFORE.format(binding="x.shape[1:]").replace(SPLIT, SPLIT + "        del prefix\n")
    after = before.replace(SPLIT, "")
    code = drop_dead_locals(cst.parse_module(before), cst.parse_module(after)).code
    assert "prefix = (n, rows)" not in code and "del prefix" not in code, code


def test_a_name_deleted_with_a_live_one_keeps_its_assignment() -> None:
    before = BEFORE.format(binding="x.shape[1:]").replace(
        SPLIT, SPLIT + "        del prefix, rows\n"
    )
    after = before.replace(SPLIT, "")
    code = drop_dead_locals(cst.parse_module(before), cst.parse_module(after)).code
    assert "prefix = (n, rows)" in code and "del prefix, rows" in code, code
    assert "shape = x.shape[1:]" not in code, code  # not deleted: it goes as before
