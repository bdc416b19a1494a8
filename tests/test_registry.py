"""Meta-tests: the registry is complete and every pass documents itself truthfully."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from jaxmigrate.model import Options, Safety
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.registry import all_passes, find_pass, select_passes

CODEMODS = Path(__file__).resolve().parent.parent / "codemods"
SECTIONS = ("## Why", "## Before", "## After", "## Safety", "## Skips", "## Verification")
PASSES = all_passes()


def module_doc(p) -> str:
    return sys.modules[p.__module__].__doc__ or ""


def test_every_module_is_registered() -> None:
    # A rule is a module or, when large enough for sections, a package; helpers start with `_`.
    files = {p.stem for p in CODEMODS.glob("*.py")}
    packages = {p.parent.name for p in CODEMODS.glob("*/__init__.py")}
    modules = {m for m in files | packages if not m.startswith("_")}
    registered = {p.__module__.rsplit(".", 1)[1] for p in PASSES}
    assert modules == registered, f"missing from PASSES: {modules - registered}"


def test_identities_are_unique_and_consistent() -> None:
    assert len({p.CODE for p in PASSES}) == len(PASSES)
    assert len({p.NAME for p in PASSES}) == len(PASSES)
    for p in PASSES:
        assert re.fullmatch(r"JM\d{3}", p.CODE), p.CODE
        module = p.__module__.rsplit(".", 1)[1]
        assert module == p.NAME.replace("-", "_"), (module, p.NAME)
        assert p.__name__ == "".join(w.capitalize() for w in module.split("_")), p.__name__
        assert isinstance(p.SAFETY, Safety)


@pytest.mark.parametrize("p", PASSES, ids=lambda p: p.NAME)
def test_doc_has_every_section(p) -> None:
    doc = module_doc(p)
    first = doc.strip().splitlines()[0]
    assert first == p.summary(), "module and class docstrings must open with the same line"
    for section in SECTIONS:
        assert section in doc, f"{p.NAME}: no {section!r} section"


def fenced(doc: str, section: str) -> str:
    body = doc.split(section, 1)[1]
    match = re.search(r"```python\n(.*?)```", body, re.DOTALL)
    assert match, f"no python block under {section}"
    return match.group(1)


@pytest.mark.parametrize("p", PASSES, ids=lambda p: p.NAME)
def test_doc_before_becomes_after(p) -> None:
    doc = module_doc(p)
    before, after = fenced(doc, "## Before"), fenced(doc, "## After")
    result = migrate_source(before, options=Options(unsafe_fixes=True))
    assert result.code == after
    assert any(s.code == p.CODE for s in result.sites)


def test_lookup_by_code_and_name() -> None:
    for p in PASSES:
        assert find_pass(p.CODE) is p
        assert find_pass(p.NAME) is p
        assert find_pass(p.NAME.replace("-", "_")) is p


def test_select_and_ignore() -> None:
    assert select_passes(["JM1"], []) == tuple(p for p in PASSES if p.CODE.startswith("JM1"))
    assert find_pass("pmap") not in select_passes([], ["pmap"])
    with pytest.raises(ValueError, match="unknown rule"):
        select_passes(["JM999"], [])


ROOT = CODEMODS.parent
REFERENCES_MODULE = ROOT / "src" / "jaxmigrate" / "verify" / "child" / "references.py"


def literal_strings(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value.__class__ is str
    }


def test_a_rule_code_is_written_only_on_its_pass() -> None:
    """A rule's facts live on the rule: no other module spells its code (read `Pass.CODE`)."""
    codes = {p.CODE: Path(sys.modules[p.__module__].__file__ or "").resolve() for p in PASSES}
    modules = [*CODEMODS.glob("*.py"), *(ROOT / "src" / "jaxmigrate").rglob("*.py")]
    for module in modules:
        for code in literal_strings(module) & codes.keys():
            assert module.resolve() == codes[code], f"{module.name} spells {code}"


def test_every_reference_is_one_the_verifier_has() -> None:
    """`Pass.REFERENCE` names an entry of the child's `REFERENCES` (which imports JAX: read as
    text); the planner reads the references from the registry."""
    from jaxmigrate.verify.planner import reference_by_pass

    known = literal_strings(REFERENCES_MODULE)
    with_reference = [p for p in PASSES if p.REFERENCE is not None]
    assert with_reference, "no pass declares a verification reference"
    for p in with_reference:
        assert p.REFERENCE in known, f"{p.NAME}: unknown reference {p.REFERENCE!r}"
    assert reference_by_pass() == {p.NAME: p.REFERENCE for p in with_reference}


@pytest.mark.parametrize("p", PASSES, ids=lambda p: p.NAME)
def test_min_jax_is_where_the_rewrite_starts(p) -> None:
    """The doc's Before is rewritten for a target of MIN_JAX (or the MIN_JAX of a rule whose
    sites it needs, as pjit's under `with mesh:`), and skipped one minor below."""
    before = fenced(module_doc(p), "## Before")
    latest = migrate_source(before, options=Options(unsafe_fixes=True))
    target = max(find_pass(s.code).MIN_JAX for s in latest.sites)
    assert target == p.MIN_JAX or target > p.MIN_JAX and p.NAME == "pjit"
    at = migrate_source(before, options=Options(unsafe_fixes=True, target_jax=target))
    assert any(s.code == p.CODE for s in at.sites)
    older = (p.MIN_JAX[0], p.MIN_JAX[1] - 1)
    below = migrate_source(before, options=Options(unsafe_fixes=True, target_jax=older))
    assert not any(s.code == p.CODE for s in below.sites)
    assert any(s.code == p.CODE for s in below.skips)
    if target == p.MIN_JAX:
        wanted = f"needs JAX >= {p.MIN_JAX[0]}.{p.MIN_JAX[1]}"
        assert any(s.code == p.CODE and wanted in s.reason for s in below.skips), below.skips
