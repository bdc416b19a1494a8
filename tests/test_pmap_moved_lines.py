"""Statements the program-level rewrite moves one block deeper, under `with jax.set_mesh(mesh):`
(`_program.fitted`, `moved`): one that fitted its lines before and no longer does is laid out again,
as the formatter would; one that did not fit before, or holds a comment, stays as written."""

from __future__ import annotations

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

SOURCE = """\
import functools

import jax
import jax.numpy as jnp
from flax import jax_utils


@functools.partial(jax.pmap, axis_name="i")
def p_step(params, x):
    return jax.lax.psum(jnp.sum(x * params), "i")


def evaluate(w, batches, report=print):
    params = jax_utils.replicate(w)
    total = 0.0
    for batch in batches:
        total += p_step(params, batch)[0]
    report("the total of the evaluation of the batches, summed over", total, "rows", 1)
    report("the total of the evaluation of the batches, summed over", total, "the rows",
           2)
    report("the total of the evaluation of the batches", total, "rows", 3)  # a comment
    report("a line too long before the rewrite moved it: the formatter left it long", total)
    return total
"""


def test_a_moved_statement_that_no_longer_fits_is_laid_out_again() -> None:
    widths = [len(line) for line in SOURCE.splitlines()]
    assert max(widths) > 88 and sorted(widths)[-2] <= 88  # the last report only
    code = migrate_source(SOURCE, options=Options(unsafe_fixes=True)).code
    assert "    with jax.set_mesh(mesh):\n" in code, code
    # fitted at 4 spaces, not at 8: laid out again, black's way
    assert (
        "        report(\n"
        '            "the total of the evaluation of the batches, summed over", total, "rows", 1\n'
        "        )\n"
    ) in code, code
    assert (
        "        report(\n"
        '            "the total of the evaluation of the batches, summed over",\n'
        "            total,\n"
        '            "the rows",\n'
        "            2,\n"
        "        )\n"
    ) in code, code
    # a comment: as written, one level deeper
    assert (
        '        report("the total of the evaluation of the batches", total, "rows", 3)  # a'
        in code
    )
    # too long before the move: the formatter had left it so
    assert '        report("a line too long before the rewrite moved it: the formatter left' in code


STEP_COMMENT = """\
import jax
import jax.numpy as jnp
from flax import jax_utils
from flax.training import common_utils


def step(w, x):
    return w - jax.lax.pmean(jnp.mean(x) * w, "batch")


def train(w, xs):
    p_step = jax.pmap(step, axis_name="batch")  # the step, one per device
    w = jax_utils.replicate(w)
    for x in xs:
        w = p_step(w, common_utils.shard(x))
    return jax_utils.unreplicate(w)
"""


def test_the_step_statements_comment_stays_on_the_step() -> None:
    """The statement making the step is written anew (the mesh before it): its own trailing
    comment stays on the step's line, as the maintainer wrote it (flax wmt's `)  # eos token,
    max_length are constant`)."""
    code = migrate_source(STEP_COMMENT, options=Options(unsafe_fixes=True)).code
    assert "jax.shard_map(" in code, code
    assert "# the step, one per device" in code, code
    line = next(line for line in code.splitlines() if "# the step, one per device" in line)
    assert line.endswith(")  # the step, one per device"), code
