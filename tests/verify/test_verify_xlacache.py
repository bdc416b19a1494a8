"""The verification workers' XLA compilation cache (`verify/xlacache.py`): where it lives, when it
is off, how it is bounded, and that a run verifies the same with it, without it, and over damaged
entries."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from clitools import cli_env, jm

from jaxmigrate.verify import xlacache
from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.pool import child_env
from jaxmigrate.verify.workspace import Workspace

PROGRAM = Path(__file__).parent.parent / "fixtures" / "pmap" / "program_state_returned_by_callee.py"


def test_the_folder_is_in_jaxmigrates_cache_unless_told(tmp_path: Path) -> None:
    home = {"JAXMIGRATE_CACHE_DIR": str(tmp_path / "cache")}
    assert xlacache.folder(home) == tmp_path / "cache" / "xla"
    assert xlacache.folder({**home, xlacache.ENV: str(tmp_path / "x")}) == tmp_path / "x"
    for off in ("0", "off", "OFF", "false", "no"):
        assert xlacache.folder({**home, xlacache.ENV: off}) is None
    # a user's own JAX cache is theirs: the workers then leave JAX's settings alone
    assert xlacache.folder({**home, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "j")}) is None


def test_prepare_makes_the_folder_and_says_none_when_it_cannot(tmp_path: Path) -> None:
    made = xlacache.prepare({xlacache.ENV: str(tmp_path / "a" / "b")})
    assert made == tmp_path / "a" / "b" and made.is_dir()
    (tmp_path / "file").write_text("")
    assert xlacache.prepare({xlacache.ENV: str(tmp_path / "file" / "x")}) is None
    assert xlacache.prepare({xlacache.ENV: "0"}) is None


def test_trim_removes_the_oldest_entries_past_the_limit(tmp_path: Path) -> None:
    for i in range(10):  # entry i written at time i, 100 bytes each
        entry = tmp_path / f"e{i}-cache"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, ns=(i * 10**9, i * 10**9))
    (tmp_path / "sub").mkdir()  # not an entry: never removed, never counted
    assert xlacache.trim(tmp_path, limit=1000, keep=600) == 0  # 1,000 bytes: within the limit
    (tmp_path / "e9-cache").write_bytes(b"x" * 101)
    assert xlacache.trim(tmp_path, limit=1000, keep=600) == 5
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["e5-cache", "e6-cache", "e7-cache", "e8-cache", "e9-cache", "sub"]


def verified_sites(report: Path) -> list[tuple[int, str]]:
    sites = json.loads(report.read_text())["files"][0]["sites"]
    return [(s["line"], s["status"]) for s in sites]


@pytest.mark.jax
def test_a_run_verifies_the_same_cold_warm_damaged_and_off(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(PROGRAM, tree / PROGRAM.name)
    cache = tmp_path / "xla"

    def run(tag: str, setting: str) -> list[tuple[int, str]]:
        report = tmp_path / f"{tag}.json"
        env = cli_env(**{xlacache.ENV: setting})
        args = ("run", "--dry-run", "--no-cache", "--jobs", "1", "--report", str(report), ".")
        proc = jm(*args, cwd=tree, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return verified_sites(report)

    cold = run("cold", str(cache))
    assert cold and all(status == "verified" for _, status in cold), cold
    entries = sorted(p for p in cache.iterdir() if p.is_file())
    assert entries, "the workers compiled nothing into the cache"
    assert run("warm", str(cache)) == cold
    for entry in entries:  # every entry damaged: each is a miss, compiled again, never an error
        entry.write_bytes(b"not an executable")
    assert run("damaged", str(cache)) == cold
    shutil.rmtree(cache)
    assert run("off", "0") == cold
    assert not cache.exists()


def test_a_job_of_several_processes_runs_without_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JAX 0.12.1 hangs running a cross-process (gloo) program it loaded from the cache: the
    workers of a `--processes 2` job are not given it; a one-process worker is."""
    (tmp_path / "xla").mkdir()
    monkeypatch.setenv(xlacache.ENV, str(tmp_path / "xla"))
    ws = Workspace(tmp_path / "ws")
    alone = child_env(VerifyConfig(tmp_path), ws)
    assert alone[xlacache.ENV] == str(tmp_path / "xla")
    for process in (0, 1):
        env = child_env(VerifyConfig(tmp_path, processes=2), ws, (), process, "localhost:1")
        assert xlacache.ENV not in env and env["JAXMIGRATE_COORDINATOR"] == "localhost:1"
