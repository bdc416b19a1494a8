"""Batches from an input iterator a def of the module makes (`codemods/pmap/_inputs.py`): the
shapes where the iterator cannot be made to yield flat batches, and what the step does then."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

TAKEN = (FIXTURES / "pmap" / "program_input_iterator.py").read_text()
LOOP = "    for step, batch in zip(range(4), train_iter):\n"


def train_step_message(source: str) -> str:
    result = migrate_source(source, options=Options())
    return next(
        s.message
        for s in result.sites
        if s.line == source.count("\n", 0, source.index("p_train_step = ")) + 1
    )


INIT = "    train_iter = _create_input_iter(0, 4)\n"
PREPARE = "    return jax.tree_util.tree_map(_prepare, xs)\n"
MAKER = "def _create_input_iter(seed, steps):\n"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (LOOP, LOOP + "        print(batch['x'].shape)\n"),  # the batch read split per device
        (INIT, INIT + "    print(next(train_iter)['x'].shape)\n"),  # the iterator read so
        (PREPARE, "    _prepare(xs['x'])\n" + PREPARE),  # the nested def called otherwise too
        (MAKER, MAKER + "    map = lambda f, d: d\n"),  # `map` rebound
    ],
    ids=["batch read", "iterator read", "nested def called", "map rebound"],
)
def test_other_reads_keep_the_batches_per_device_converted_where_passed(old: str, new: str) -> None:
    """The iterator keeps yielding batches split per device; each is converted where the step
    takes it (`global_batch`, as for any iterator the analysis does not see into)."""
    assert old in TAKEN
    source = TAKEN.replace(old, new, 1)
    assert "(program-level)" in train_step_message(source)
    code = migrate_source(source, options=Options(unsafe_fixes=True)).code
    assert "global_batch(batch, batch_sharding)" in code and "prefetch_to_device" in code, code


@pytest.mark.parametrize(
    "other",
    [
        "    _prepare_data({'x': 1})\n",  # the mapped def called by the step's function too
        "    next(_create_input_iter(2, 1))\n",  # the iterator made again, read otherwise
    ],
)
def test_defs_used_elsewhere_keep_the_iterator_and_convert_where_passed(other: str) -> None:
    """Code other than the step's calls uses the iterator's defs (flax imagenet's notebook
    draws batches of `create_input_iter` for a pmap of its own): the iterator keeps yielding
    batches split per device, and each is converted where the step takes it, as a batch of an
    iterator the analysis does not see into (it was PL301 before)."""
    source = TAKEN.replace(INIT, INIT + other, 1)
    assert "(program-level)" in train_step_message(source)
    code = migrate_source(source, options=Options(unsafe_fixes=True)).code
    assert "global_batch(batch, batch_sharding)" in code and "prefetch_to_device" in code, code
    assert "x.reshape((local_device_count, -1) + x.shape[1:])" in code, code


def test_the_fixture_takes_it() -> None:
    assert "(program-level)" in train_step_message(TAKEN)


@pytest.mark.parametrize("below", ["\n", "\n# a comment\n"])
def test_the_converter_helper_has_two_blank_lines_on_each_side(below: str) -> None:
    """The `global_batch` helper goes after the imports as the faithful helper does: two blank
    lines above the next statement, whatever it had (one blank line made three; a comment made
    one)."""
    source = (FIXTURES / "pmap" / "program_drawn_batches.py").read_text()
    imports = "from flax import jax_utils\n"
    source = source.replace(imports + "\n\n", imports + below, 1)
    code = migrate_source(source, options=Options(unsafe_fixes=True)).code
    helper_end = "    return jax.tree.map(rows, batch)\n"
    assert helper_end + "\n\n" + below.lstrip("\n") + "def loss_fn" in code
