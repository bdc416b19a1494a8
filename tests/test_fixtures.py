"""Every fixture pair: the rewrite matches, is a fixed point, and (with `main()`) runs the same.

`tests/fixtures/<pass_name>/<case>.py` rewrites to `<case>.expected.py`; a `noop_*` case must
come out byte-for-byte unchanged. `<case>.messages.txt` pins the sites and skips users read, one
`line:col CODE message` (or `line:col CODE skip: reason`) a line; none when there are neither.
A `faithful_*` case runs with `pmap_style="faithful"`: paired with a case of the same pattern in
the default (program-level) style, it shows both forms. Cases that define `main()` run before and after in separate
processes on a simulated 8-device CPU mesh; when the original cannot run on the installed JAX,
the input defines `reference()`, an equivalent form that does, and that is the reference.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, check_messages, jax_env, pinned_messages

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.registry import all_passes

CASES = sorted(p for p in FIXTURES.glob("*/*.py") if not p.name.endswith(".expected.py"))
# Small projects (`<pass_name>/projects/<project>/...`): each file is migrated with its path, so
# the project's formatter configuration and its own modules count; a file without an expected
# output must come out unchanged.
PROJECT_CASES = sorted(
    p for p in FIXTURES.glob("*/projects/*/**/*.py") if not p.name.endswith(".expected.py")
)
RUNNABLE = [p for p in CASES if re.search(r"^def main\(", p.read_text(), re.MULTILINE)]
RUNNER = Path(__file__).with_name("fixture_runner.py")


def case_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def expected_path(case: Path) -> Path:
    return case.with_name(case.stem + ".expected.py")


def messages_path(case: Path) -> Path:
    return case.with_name(case.stem + ".messages.txt")


def options_for(case: Path) -> Options:
    style = "faithful" if case.name.startswith("faithful_") else "idiomatic"
    return Options(unsafe_fixes=True, pmap_style=style)


def migrate(code: str, options: Options | None = None) -> str:
    return migrate_source(code, options=options or Options(unsafe_fixes=True)).code


def test_every_fixture_folder_names_a_pass() -> None:
    names = {p.NAME.replace("-", "_") for p in all_passes()}
    folders = {p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= names, folders - names


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fixture(case: Path, request: pytest.FixtureRequest) -> None:
    source = case.read_text()
    result = migrate_source(source, options=options_for(case))
    update = bool(request.config.getoption("--update-fixtures"))
    check_messages(messages_path(case), pinned_messages(result.sites, result.skips), update)
    folder_name = case.parent.name.replace("_", "-")
    if case.name.startswith("noop_"):
        assert result.code == source, "a noop_ case must come out unchanged"
        assert not expected_path(case).exists()
        return
    expected = expected_path(case)
    if request.config.getoption("--update-fixtures"):
        expected.write_text(result.code)
    assert expected.exists(), f"{expected.name} is missing (run pytest --update-fixtures)"
    assert result.code == expected.read_text()
    assert any(s.name == folder_name and s.applied for s in result.sites), (
        f"no {folder_name} site was applied in a positive case"
    )
    assert migrate(result.code, options_for(case)) == result.code, "the output is not a fixed point"


@pytest.mark.parametrize("case", PROJECT_CASES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_project_fixture(case: Path, request: pytest.FixtureRequest) -> None:
    source = case.read_text()
    options = Options(unsafe_fixes=True)
    result = migrate_source(source, options=options, path=str(case))
    expected = expected_path(case)
    if request.config.getoption("--update-fixtures") and result.code != source:
        expected.write_text(result.code)
    want = expected.read_text() if expected.exists() else source
    assert result.code == want
    again = migrate_source(result.code, options=options, path=str(case)).code
    assert again == result.code, "the output is not a fixed point"


def run_batch(specs: list[str], tmp: Path, tag: str) -> dict:
    """Run `specs` in one JAX process; its programs compile through a persistent compilation
    cache in `tmp`, which the other batch shares: a rewrite that leaves a program's computation
    as it was (most of the corpus: imports, spellings) costs the second batch no compile, and
    what does differ compiles as before."""
    out = tmp / f"{tag}.pkl"
    env = {
        **jax_env(8),
        "JAX_COMPILATION_CACHE_DIR": str(tmp / "xla"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(out), *specs],
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with out.open("rb") as handle:
        return pickle.load(handle)


@pytest.fixture(scope="session")
def executed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, tuple]:
    """Run every selected runnable input in one process and every expected output in another."""
    chosen = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.originalname == "test_fixture_runs_the_same"
    ]
    if not chosen:
        return {}
    tmp = tmp_path_factory.mktemp("executed")
    refs = []
    for case in chosen:
        func = (
            "reference"
            if re.search(r"^def reference\(", case.read_text(), re.MULTILINE)
            else "main"
        )
        refs.append(f"{case}:{func}")
    news = [f"{expected_path(c) if expected_path(c).exists() else c}:main" for c in chosen]
    before = run_batch(refs, tmp, "before")
    after = run_batch(news, tmp, "after")
    return {c: (before[r], after[n]) for c, r, n in zip(chosen, refs, news)}


def _is_key(x) -> bool:
    """A PRNG key as `fixture_runner` records it: `("prng_key", key_data)`."""
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and x[0] == "prng_key"


def assert_same(a, b, where: str = "out") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)) and not _is_key(a):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: structure differs"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, tuple):
        assert _is_key(b), f"{where}: key vs non-key"
        np.testing.assert_array_equal(a[1], b[1], err_msg=where)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{where}: array vs {type(b).__name__}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} != {b.shape}"
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} != {b.dtype}"
        if np.issubdtype(a.dtype, np.inexact):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.jax
@pytest.mark.xdist_group("fixture_corpus")  # one worker makes `executed` (tests/conftest.py)
@pytest.mark.parametrize("case", RUNNABLE, ids=case_id)
def test_fixture_runs_the_same(case: Path, executed: dict[Path, tuple]) -> None:
    (ref_status, ref), (new_status, new) = executed[case]
    assert ref_status == "ok", f"the reference did not run:\n{ref}"
    assert new_status == "ok", f"the rewritten code did not run:\n{new}"
    assert_same(ref, new)
