"""Steps stored on `self` and passed to a method of their class as values (big_vision's retrieval
evaluator: `self._embed(..., self._embed_images_p)`), taken by `_survey._class_group`: the
shapes around the fixture `program_stored_steps_passed_to_a_method` where it must still be
taken, and where it must not, each site then saying why."""

from __future__ import annotations

import libcst as cst
import pytest
from conftest import FIXTURES

from codemods.pmap._declines import Decline, NotVisible
from codemods.pmap._program import Program
from codemods.pmap._survey import Finding
from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

TAKEN = (FIXTURES / "pmap" / "program_stored_steps_passed_to_a_method.py").read_text()
IMAGES = '"image", params, self.images, self._embed_images_p)'


def pmap_messages(source: str) -> list[str]:
    result = migrate_source(source, options=Options())
    return [s.message for s in result.sites if s.message.startswith("`jax.pmap` ->")]


def test_the_fixture_takes_it() -> None:
    messages = pmap_messages(TAKEN)
    assert len(messages) == 4 and all("(program-level)" in m for m in messages), messages


def test_a_step_passed_by_keyword_is_taken() -> None:
    source = TAKEN.replace(IMAGES, '"image", params, self.images, embed_fn=self._embed_images_p)')
    assert source != TAKEN
    messages = pmap_messages(source)
    assert all("(program-level)" in m for m in messages), messages
    code = migrate_source(source, options=Options(unsafe_fixes=True)).code
    assert "embed_fn=self._embed_images_p" in code and "replicate(" not in code, code


ELSEWHERE = (
    "\n    def images_only(self, params):\n"
    '        return self._embed("image", params, self.images, self._embed_images_p)\n'
)
OVERRIDDEN = (
    "\n\nclass Other(Evaluator):\n    def _embed(self, name, params, ds, embed_fn):\n"
    "        return 0, embed_fn, ds\n"
)


UNRELATED = (
    "\n\nclass Other:\n    def _embed(self, name, params, ds, embed_fn):\n"
    "        return 0, embed_fn, ds\n"
)


@pytest.mark.parametrize(
    ("extra", "code", "says"),
    [
        # the method is called by another method too: neither is the one setting the mesh
        (ELSEWHERE, "PL602", "`Evaluator.evaluate` and `Evaluator.images_only`"),
        # a subclass's override would be called instead: what it does with the step is not seen
        (OVERRIDDEN, "PL201", "is overridden by `Other._embed`: which definition runs"),
        # another class's method of that name: not an override, but not told apart either
        (UNRELATED, "PL201", "is one of several defs named `_embed` in this module"),
    ],
    ids=["called elsewhere", "overridden", "same name elsewhere"],
)
def test_a_method_not_only_called_by_the_caller_keeps_the_steps_per_device(
    extra: str, code: str, says: str
) -> None:
    anchor = "\n\ndef main():"
    source = TAKEN.replace(anchor, extra + anchor, 1)
    messages = pmap_messages(source)
    assert messages and not any("(program-level)" in m for m in messages), messages
    assert all("program-level form not taken: [PL" in m for m in messages), messages
    assert f"[{code}]" in messages[0], messages  # `self._embed_images_p`'s site, first
    assert says in messages[0], messages[0]


def _program(batches: list[bool], varying: list[bool]) -> Program:
    host = cst.ensure_type(cst.parse_statement("def f(x):\n    return x\n"), cst.FunctionDef)
    program = Program(
        host, None, cst.Name("body"), cst.SimpleString('"batch"'), None, batches, None
    )
    program.varying = varying
    return program


def test_steps_through_one_parameter_laid_out_differently_are_declined() -> None:
    alike = {
        (1, "embed_fn"): [
            ("_a", _program([False, True], [False])),
            ("_b", _program([False, True], [False])),
        ]
    }
    Finding._passed_alike(alike)  # the same layouts: taken
    differ = {
        (1, "embed_fn"): [
            ("_a", _program([False, True], [False])),
            ("_b", _program([False, True], [True])),
        ]
    }
    with pytest.raises(NotVisible) as raised:
        Finding._passed_alike(differ)
    assert raised.value.code is Decline.CALLS_DIFFER
    assert "`_a` and `_b` are passed to one parameter" in raised.value.why


def test_a_methods_result_passed_to_a_step_is_not_taken_for_a_steps_result() -> None:
    """`z = self._embed_texts(params)` is what that method returns (here a host array, whose
    leading axis pmap maps), not a result of a step: passed to a step as it is, its layout is
    not known (PL301), where taking it for a step's result would make it `P()`."""
    two = (FIXTURES / "pmap" / "program_stored_steps_in_two_methods.py").read_text()
    source = two.replace(
        'self._score_p(params, batch["x"], z_p, mask)', 'self._score_p(params, batch["x"], z, mask)'
    )
    assert source != two
    messages = pmap_messages(source)
    assert not any("(program-level)" in m for m in messages), messages
    assert (
        "[PL301]" in messages[0]
        and "(`z`, unpacked from `self._embed_texts(params)`)" in messages[0]
    ), messages


def test_a_method_passed_a_plain_function_too_keeps_the_steps_per_device() -> None:
    """`_embed` is passed a step at two calls and a function of the code's own at a third: its
    edits (the readback of `embed_fn(...)[0]` deleted, the batch converted), made for the
    steps, would run on that function too (PL204, naming it)."""
    old = "        return n_img, n_txt, z_img @ z_txt.T, img_ids, txt_ids\n"
    new = (
        '        extra = self._embed("text", params, self.texts, lambda p, x: x)\n'
        "        return n_img, n_txt, z_img @ z_txt.T, img_ids, txt_ids, extra\n"
    )
    assert old in TAKEN
    messages = pmap_messages(TAKEN.replace(old, new, 1))
    assert len(messages) == 4, messages
    why = (
        "[PL204] `_embed` is passed steps stored on `self` as `embed_fn`, and "
        "`lambda p, x: x` at another call"
    )
    assert all(why in m for m in messages), messages
