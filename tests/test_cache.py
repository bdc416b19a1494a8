"""The result cache never changes a result: same reports with and without it, after edits and
option changes; broken entries are ignored; concurrent writers leave whole entries."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from clitools import cli_env, command, jm
from test_cli import LEGACY

from jaxmigrate.model import Bucket, FileResult, Options
from jaxmigrate.pipeline.cache import CACHE_DIR, ResultCache, user_cache_root
from jaxmigrate.pipeline.discovery import Discovery
from jaxmigrate.pipeline.files import cache_context
from jaxmigrate.pipeline.project import Project
from jaxmigrate.pipeline.runner import migrate_files

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every pass's fixtures (inputs and outputs), every notebook fixture, and broken files.

    Of the pmap rule's single-file cases (427 files with its projects, 85% of the engine's time over all fixtures), one in
    four, in name order, with its expected output: every kind of site and detail the cache
    stores is among them, and the option sets below run the engine over the corpus 6 times."""
    root = tmp_path_factory.mktemp("corpus")
    shutil.copytree(TESTS / "fixtures", root / "fixtures")
    pmap = root / "fixtures" / "pmap"
    files = [p for p in pmap.iterdir() if p.is_file()]
    cases = sorted({p.name.split(".")[0] for p in files})
    for path in files:
        if cases.index(path.name.split(".")[0]) % 4:
            path.unlink()
    shutil.copytree(TESTS / "fixtures_notebooks", root / "notebooks")
    (root / "broken.py").write_text("import jax\nf = jax.pmap(\n")
    (root / "broken.ipynb").write_text('{"cells": [')
    return root


def results(root: Path, options: Options, cache: ResultCache | None) -> list[FileResult]:
    found = list(Discovery().find([root]))
    return list(migrate_files(found, options, cache=cache))


def same(left: list[FileResult], right: list[FileResult]) -> None:
    assert left == right
    # Site.details is left out of dataclass equality: compare the report form too
    assert [r.to_json() for r in left] == [r.to_json() for r in right]


OPTION_SETS = [
    Options(),
    Options(unsafe_fixes=True, target_jax=(0, 4)),
    Options(select=("JM1",), ignore=("pjit",)),
]


def test_cold_warm_and_uncached_agree_under_every_option_set(corpus: Path, tmp_path: Path) -> None:
    for options in OPTION_SETS:
        cache = ResultCache.open(tmp_path, options)
        bare = results(corpus, options, None)
        assert any(r.bucket is Bucket.CHANGED for r in bare)
        cold = results(corpus, options, cache)
        warm = results(corpus, options, cache)
        same(bare, cold)
        same(bare, warm)
    folders = list((tmp_path / CACHE_DIR / "v1").iterdir())
    assert len(folders) == len(OPTION_SETS)  # every option set has its own entries


def read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def test_entries_hold_only_what_the_engine_decided(corpus: Path, tmp_path: Path) -> None:
    cache = ResultCache.open(tmp_path, Options())
    fresh = results(corpus, Options(), cache)
    entries = {p.name for p in cache.directory.iterdir()}
    failed = [r for r in fresh if r.bucket is Bucket.FAILED]
    found = [r for r in fresh if r.bucket is not Bucket.FAILED and (r.sites or r.skips)]
    assert failed and found
    # every file with something to say is kept; failures never are
    key = {
        r.path: cache.key(
            Path(r.path).read_bytes(),
            notebook=r.path.endswith(".ipynb"),
            context=cache_context(Project(), r.path, read(r.path), Options()),
        )
        for r in fresh
    }
    assert {f"{key[r.path]}.json" for r in found} <= entries
    assert not {f"{key[r.path]}.json" for r in failed} & entries
    assert (tmp_path / CACHE_DIR / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (tmp_path / CACHE_DIR / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f59")


def test_edits_are_seen(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(LEGACY)
    (tree / "b.py").write_text("import jax\n")
    cache = ResultCache.open(tmp_path, Options())
    first = results(tree, Options(), cache)
    (tree / "a.py").write_text("import jax\n")
    (tree / "b.py").write_text(LEGACY)
    second = results(tree, Options(), cache)
    same(second, results(tree, Options(), None))
    assert [r.bucket for r in first] == [Bucket.CHANGED, Bucket.UNCHANGED]
    assert [r.bucket for r in second] == [Bucket.UNCHANGED, Bucket.CHANGED]


def test_same_bytes_as_python_and_as_notebook_are_different_entries(tmp_path: Path) -> None:
    cache = ResultCache.open(tmp_path, Options())
    data = (TESTS / "fixtures_notebooks" / "colab.ipynb").read_bytes()
    assert cache.key(data, notebook=True) != cache.key(data, notebook=False)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b"",
        lambda b: b[: len(b) // 2],
        lambda b: b"garbage\n{}",
        lambda b: b.replace(b'"changed"', b'"changes"'),
        lambda b: b.splitlines()[0] + b'\n{"bucket": "changed"}',
        lambda b: b"\xff\xfe\x00",
    ],
    ids=["empty", "truncated", "garbage", "bit-flip", "forged-shape", "binary"],
)
def test_a_broken_entry_is_a_miss_never_an_error(tmp_path: Path, damage) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(LEGACY)
    cache = ResultCache.open(tmp_path, Options())
    expected = results(tree, Options(), cache)
    (entry,) = cache.directory.iterdir()
    entry.write_bytes(damage(entry.read_bytes()))
    same(results(tree, Options(), cache), expected)
    same(results(tree, Options(), cache), expected)  # and the entry was written again


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(LEGACY)
    (tmp_path / "blocked").write_text("a file where the cache folder would go")
    cache = ResultCache.open(tmp_path / "blocked", Options())
    same(results(tree, Options(), cache), results(tree, Options(), None))


def test_unrelated_details_survive_the_round_trip(tmp_path: Path) -> None:
    cache = ResultCache.open(tmp_path, Options())
    (site,) = results_for(LEGACY, tmp_path).sites
    result = FileResult("a.py", Bucket.CHANGED, sites=(replace(site, details={"k": [1]}),))
    cache.store("k", replace(result, old_text="x", new_text="y"))
    loaded = cache.load("k", "a.py", "x")
    assert loaded is not None and loaded.sites[0].details == {"k": [1]}
    assert loaded.new_text == "y" and loaded.old_text == "x"


def results_for(text: str, tmp_path: Path) -> FileResult:
    path = tmp_path / "one.py"
    path.write_text(text)
    (result,) = results(path, Options(), None)
    return result


def test_cli_cache_and_no_cache(corpus: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(corpus / "notebooks", tree)
    (tree / "pyproject.toml").write_text("[tool.jaxmigrate]\n")
    args = ("check", "--format", "json")
    env = cli_env(XDG_CACHE_HOME=str(tmp_path / "user-cache"))
    bare = jm(*args, "--no-cache", ".", cwd=tree, env=env)
    assert not (tmp_path / "user-cache").exists()
    cold = jm(*args, ".", cwd=tree, env=env)
    warm = jm(*args, ".", cwd=tree, env=env)
    assert not (tree / CACHE_DIR).exists()  # `check` is a dry run: its cache is the user's
    assert list((tmp_path / "user-cache" / "jaxmigrate").glob("*/v1/*/*.json"))
    assert bare.stdout == cold.stdout == warm.stdout and bare.returncode == warm.returncode == 1
    changed = jm(*args, "--select", "JM101", ".", cwd=tree, env=env)
    no_cache = jm(*args, "--select", "JM101", "--no-cache", ".", cwd=tree, env=env)
    assert changed.stdout == no_cache.stdout
    assert changed.stdout != warm.stdout
    # a run that writes keeps its cache in the project; the folder is never migrated
    jm("run", "--no-verify", "--allow-dirty", "--select", "JM101", ".", cwd=tree, env=env)
    assert (tree / CACHE_DIR).is_dir()
    assert CACHE_DIR not in jm("run", "--dry-run", "--no-verify", ".", cwd=tree, env=env).stdout


def _snapshot(tree: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(tree)): p.read_bytes() if p.is_file() else None
        for p in sorted(tree.rglob("*"))
    }


def test_a_dry_run_writes_nothing_in_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --dry-run` (and `check`) leave the project byte for byte as it was, no new file or
    folder (the result cache used to appear as `.jaxmigrate_cache/`); their cache is kept in
    the user's cache directory, and answers the next dry run."""
    tree = tmp_path / "legacy_project"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "legacy_project", tree)
    before = _snapshot(tree)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    env = cli_env()
    first = jm("run", "--dry-run", "--no-verify", ".", cwd=tree, env=env)
    assert "JM202" in first.stdout  # the example has sites: the dry run shows their diffs
    again = jm("run", "--dry-run", "--no-verify", ".", cwd=tree, env=env)
    jm("check", ".", cwd=tree, env=env)
    assert _snapshot(tree) == before
    assert again.stdout == first.stdout
    entries = list(user_cache_root(tree).glob("v1/*/*.json"))
    assert entries and (user_cache_root(tree) / "CACHEDIR.TAG").is_file()


def test_concurrent_writers_leave_whole_entries(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    for folder in ("pmap", "pjit", "legacy_imports"):
        (tree / folder).mkdir(parents=True)
        # every fourth file of each folder (the pmap folder alone holds 395): over a hundred
        # files, cached by two runs at once, are chances enough to tear an entry
        for case in sorted((corpus / "fixtures" / folder).glob("*.py"))[::4]:
            shutil.copyfile(case, tree / folder / case.name)
    (tree / "pyproject.toml").write_text("[tool.jaxmigrate]\n")
    cmd = command("check", "--format", "json", "--jobs", "2", ".")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    env = cli_env()
    procs = [
        subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert outputs[0] == outputs[1]
    entries = list((user_cache_root(tree) / "v1").glob("*/*"))
    assert entries and all(not e.name.startswith(".tmp-") for e in entries)
    cache = ResultCache(entries[0].parent)
    assert all(cache.load(e.stem, "x.py", "") is not None for e in entries)
    bare = jm("check", "--format", "json", "--no-cache", ".", cwd=tree)
    assert json.loads(bare.stdout) == json.loads(outputs[0])


def test_engine_results_depend_on_the_path_only_through_the_project(
    corpus: Path, tmp_path: Path
) -> None:
    """Entries are keyed by content and `Project.context` (the formatter settings and own
    modules a file's path leads to): in another place with the same context, a file gives the
    same result; a project configuration changes the context."""
    from jaxmigrate.pipeline.files import migrate_text

    options = Options(unsafe_fixes=True)
    for case in sorted((corpus / "fixtures").glob("*/*.py"))[::7]:
        moved = tmp_path / "moved" / case.parent.name
        if not moved.exists():
            shutil.copytree(case.parent, moved)
        there_path = str(moved / case.name)
        assert Project().context(str(case)) == Project().context(there_path)
        code = case.read_text()
        here = migrate_text(code, path=str(case), options=options)
        there = migrate_text(code, path=there_path, options=options)
        assert (here.code, here.sites, here.skips) == (there.code, there.sites, there.skips)
    (tmp_path / "moved" / "pyproject.toml").write_text("[tool.ruff]\nline-length = 60\n")
    assert Project().context(there_path) != Project().context(str(case))
