"""Shared test set-up: the fixture corpus, the `--update-fixtures` option, JAX subprocess env, and
the grouping of tests that share an expensive fixture when pytest-xdist spreads them (`-n`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from jaxmigrate.model import Site, Skip
from jaxmigrate.verify.processes import with_devices

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help=(
            "rewrite every fixture's expected output and <case>.messages.txt from the current"
            " passes (review the diff!)"
        ),
    )


SHARED_SCOPES = ("session", "package", "module", "class")


# Marked as each test is collected, before any collection_modifyitems hook (xdist's, which
# reads them into node ids) runs. Under pytest 9.2 (the Python 3.12 leg) xdist 3.8 ignores
# `xdist_group` marks altogether (explicit ones too): `.ci/run` gives that leg `--dist loadfile`.
def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (`-n N --dist loadgroup`, as `.ci/run` runs), keep the tests that use
    one of our module- or session-scoped fixtures (a verification batch, a migrated project, the
    fixture corpus run in one JAX process) on one worker: each worker would otherwise make the
    fixture again, in its own JAX subprocesses. The group is the fixture's own scope: the module
    for a module-scoped fixture, the fixture itself for a session-scoped one."""
    if not item.config.pluginmanager.hasplugin("xdist"):
        return
    if item.get_closest_marker("xdist_group"):
        return
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return
    groups = []
    for name, defs in info.name2fixturedefs.items():
        fixturedef = defs[-1]
        if fixturedef.scope not in SHARED_SCOPES or not fixturedef.baseid:
            continue  # function-scoped, or pytest's own (tmp_path_factory)
        if fixturedef.scope in ("session", "package"):
            groups.append(f"{fixturedef.baseid}::{name}")
        else:
            groups.append(item.nodeid.split("::")[0])
    if groups:
        item.add_marker(pytest.mark.xdist_group(min(groups)))


# XLA compiles every program the tests run for the CPU, and its compile is most of the suite's
# CPU time (72% of the fixture corpus's run, by cProfile); LLVM's optimisation of the generated
# code is a quarter of that, and the tests' programs are tiny: they compile at XLA's backend
# optimisation level 0, without LLVM's expensive passes (same results: fast-math stays off).
# Set here, before any test starts a process: every JAX process the tests start, directly or
# through `jaxmigrate` (whose verification keeps the flags it is given), inherits them.
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
_flags = os.environ.get("XLA_FLAGS", "").split()
os.environ["XLA_FLAGS"] = " ".join([*_flags, *(f for f in FAST_COMPILE_FLAGS if f not in _flags)])


def jax_env(devices: int = 8) -> dict[str, str]:
    """Environment for a subprocess that runs JAX on a simulated CPU mesh of `devices` devices
    (the tests' other XLA flags kept)."""
    env = with_devices(os.environ, devices)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("PYTHONHASHSEED", "0")
    return env


@pytest.fixture
def python() -> str:
    return sys.executable


def pinned_messages(sites: Iterable[Site], skips: Iterable[Skip]) -> str:
    """The user-facing text of a file's sites and skips, one line each, in source order:
    `line:col CODE message` and `line:col CODE skip: reason` (`[cell N]:line:col ...` in a
    notebook). A fixture pins it in `<case>.messages.txt`, so a changed message is a diff."""
    entries = [(s.cell or 0, s.line, s.col, s.code, s.message) for s in sites]
    entries += [(k.cell or 0, k.line, k.col, k.code, f"skip: {k.reason}") for k in skips]
    lines = []
    for cell, line, col, code, text in sorted(entries, key=lambda e: e[:3]):
        where = f"[cell {cell}]:{line}:{col}" if cell else f"{line}:{col}"
        lines.append(f"{where} {code} {text.replace(chr(10), chr(92) + 'n')}\n")
    return "".join(lines)


def check_messages(path: Path, text: str, update: bool) -> None:
    """Compare `text` with the pinned `path` (absent when there is nothing to say)."""
    if update:
        if text:
            path.write_text(text, encoding="utf-8")
        else:
            path.unlink(missing_ok=True)
    if not text:
        assert not path.exists(), f"{path.name}: no site or skip any more (--update-fixtures)"
        return
    assert path.exists(), f"{path.name} is missing (run pytest --update-fixtures)"
    assert text == path.read_text(encoding="utf-8"), f"{path.name} differs (--update-fixtures)"
