"""Faults during a writing run: SIGKILL at any moment, a full disk, a permission error.

Real `jaxmigrate run` subprocesses over real files. After any fault every file is either
wholly the old text or wholly the new one (never truncated or mixed), a file that could not be
written is reported and left as it was, and nothing is left behind but clearly named temporary
files that discovery never picks up.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clitools
import pytest
from clitools import cli_env, command
from test_bad_input import BoundRunner, bound  # noqa: F401 - the fixture, shared

LEGACY = "from jax.experimental.maps import Mesh\n\nmesh = Mesh(devices, ('x',))\n"
PMAP = """import functools

import jax
from jax.experimental.maps import Mesh


@functools.partial(jax.pmap, axis_name="batch")
def step_{i}(params, batch):
    grads = jax.grad(loss)(params, batch)
    return jax.lax.pmean(grads, axis_name="batch")
"""
# What atomic_write names its temporary file: `.<name>.<random>.jaxmigrate`, beside the file.
TEMPORARY = re.compile(r"^\.(?P<name>.+\.py)\.[a-z0-9_]{8}\.jaxmigrate$")
FILES = 200
Moment = tuple[str, float]  # ("seconds", 1.5) or ("files", 120)


def env() -> dict[str, str]:
    return cli_env(PYTHONDONTWRITEBYTECODE="1")


def jm(*args: str, cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return clitools.jm(*args, cwd=cwd, env=env(), timeout=600, **kwargs)


def make_tree(tree: Path) -> dict[str, bytes]:
    """200 files with legacy sites (one in eight with a pmap): their names and bytes."""
    tree.mkdir(parents=True)
    files = {}
    for i in range(FILES):
        text = PMAP.format(i=i) if i % 8 == 0 else LEGACY + f"# file {i}\n" + "x = 1\n" * i
        name = f"m{i:03}.py"
        (tree / name).write_text(text)
        files[name] = text.encode()
    return files


def session_survivors(session: int) -> list[int]:
    """Live (not zombie) processes of the session the killed run led."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def kill_during_run(tree: Path, args: list[str], moment: Moment, files: list[str]) -> int:
    """Start a run, SIGKILL it at `moment` (after so many seconds, or once so many files were
    replaced); return how many files had been replaced by then."""
    unit, when = moment
    inodes = {name: (tree / name).stat().st_ino for name in files}

    def replaced() -> int:
        return sum((tree / name).stat().st_ino != ino for name, ino in inodes.items())

    proc = subprocess.Popen(
        command(*args),
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
        start_new_session=True,
    )
    start = time.monotonic()
    try:
        while proc.poll() is None:
            if unit == "seconds" and time.monotonic() - start >= when:
                break
            if unit == "files" and replaced() >= when:
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(0.5)
        assert not session_survivors(proc.pid), "processes of the killed run are still running"
    finally:
        if os.name == "posix":
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return replaced()


Expected = tuple[dict[str, bytes], dict[str, bytes], Path]
SHARED = "_pmap_compat.py"  # the project's one pmap helper, written with the files needing it


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> Expected:
    """The files before and after a run that was not interrupted, and that run's cache."""
    tree = tmp_path_factory.mktemp("reference") / "tree"
    before = make_tree(tree)
    proc = jm("run", "--no-verify", "--unsafe-fixes", "--allow-dirty", ".", cwd=tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = {name: (tree / name).read_bytes() for name in before}
    assert all(after[n] != before[n] for n in before)
    return before, after, tree / ".jaxmigrate_cache"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find processes")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigkill_leaves_every_file_wholly_old_or_wholly_new(
    tmp_path: Path, jobs: str, expected: Expected
) -> None:
    before, after, cache = expected
    names = sorted(before)
    rng = random.Random(f"sigkill-{jobs}")
    # Mostly in the middle of writing (after a random number of files), once at a random time.
    moments: list[Moment] = [("files", rng.randint(1, FILES - 1)) for _ in range(4)]
    moments.append(("seconds", rng.uniform(0.0, 3.0)))
    args = ["run", "--no-verify", "--unsafe-fixes", "--allow-dirty", "--jobs", jobs, "."]
    seen = []
    for k, moment in enumerate(moments):
        tree = tmp_path / f"run{k}"
        make_tree(tree)
        if moment[0] == "files" and cache.is_dir():  # warm: the run reaches its writes sooner
            shutil.copytree(cache, tree / cache.name)
        written = kill_during_run(tree, args, moment, names)
        new = 0
        for name in names:
            data = (tree / name).read_bytes()
            assert data in (before[name], after[name]), f"{name} is neither old nor new"
            new += data == after[name]
        assert new == written
        leftovers = [
            p.name for p in tree.iterdir() if p.name not in before and p.name != ".jaxmigrate_cache"
        ]
        if new:  # a rewritten file imports the shared pmap helper: it was written first, whole
            assert (tree / SHARED).read_bytes() == (cache.parent / SHARED).read_bytes()
        for name in leftovers:
            if name == SHARED:
                assert (tree / SHARED).read_bytes() == (cache.parent / SHARED).read_bytes()
                continue
            match = TEMPORARY.match(name)
            assert match and match.group("name") in before, f"unexpected file left: {name}"
        seen.append((moment, new, len(leftovers)))
    print(f"\nkills (moment, files new, temporary files left): {seen}")
    # The last tree, run to the end: everything new, the temporary files ignored.
    proc = jm(*args, "--report", "../report.json", cwd=tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {n: (tree / n).read_bytes() for n in names} == after
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted(f["path"] for f in report["files"]) == sorted([*names, SHARED])
    assert any(0 < new < FILES for _, new, _ in seen), seen  # some kills did land mid-write


# --- A full disk ----------------------------------------------------------------------------


def big_legacy() -> str:
    return LEGACY + "".join(f"# padding line {i:06} {'.' * 60}\n" for i in range(3000))


def assert_big_failed_small_written(proc: subprocess.CompletedProcess[str], tree: Path) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (tree / "big.py").read_text() == big_legacy()
    assert (tree / "small.py").read_text() == LEGACY.replace(
        "jax.experimental.maps", "jax.sharding"
    )
    assert sorted(p.name for p in tree.iterdir()) == ["big.py", "small.py"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (root, Linux); skipped where it cannot be mounted."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root on Linux")
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill the file system, then free `leave` bytes again."""
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))


def test_full_disk(small_disk: Path) -> None:
    tree = small_disk / "tree"
    tree.mkdir()
    (tree / "big.py").write_text(big_legacy())
    (tree / "small.py").write_text(LEGACY)
    fill(small_disk, leave=64 * 1024)  # room for the small file's new copy, not the big one's
    proc = jm("run", "--no-verify", "--allow-dirty", "--no-cache", "tree", cwd=small_disk)
    assert "tree/big.py: failed: could not be written: No space left on device" in proc.stdout
    assert_big_failed_small_written(proc, tree)


def test_read_only_file_system(small_disk: Path) -> None:
    tree = small_disk / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(LEGACY)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    proc = jm("run", "--no-verify", "--allow-dirty", "--no-cache", "tree", cwd=small_disk)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tree/a.py: failed: read-only file; not written" in proc.stdout
    assert (tree / "a.py").read_text() == LEGACY


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no RLIMIT_FSIZE here")
def test_file_size_limit(tmp_path: Path) -> None:
    """Where no disk can be filled: a write beyond RLIMIT_FSIZE fails as a full disk does."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "big.py").write_text(big_legacy())
    (tree / "small.py").write_text(LEGACY)
    limit = 64 * 1024

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = jm(
        "run", "--no-verify", "--allow-dirty", "--no-cache", "tree", cwd=tmp_path, preexec_fn=cap
    )
    assert "tree/big.py: failed: could not be written: File too large" in proc.stdout
    assert_big_failed_small_written(proc, tree)


# --- Permissions ----------------------------------------------------------------------------


def test_read_only_directory(tmp_path: Path, bound: BoundRunner) -> None:  # noqa: F811
    """No temporary file can be made beside the file: reported, the file left as it was."""
    locked, free = tmp_path / "tree" / "locked", tmp_path / "tree" / "free"
    locked.mkdir(parents=True)
    free.mkdir()
    (locked / "a.py").write_text(LEGACY)
    (free / "b.py").write_text(LEGACY)
    locked.chmod(0o555)
    try:
        proc = bound("run", "--no-verify", "--allow-dirty", "--no-cache", "tree", cwd=tmp_path)
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tree/locked/a.py: failed: could not be written: Permission denied" in proc.stdout
    assert (locked / "a.py").read_text() == LEGACY
    assert sorted(p.name for p in locked.iterdir()) == ["a.py"]
    assert "jax.sharding" in (free / "b.py").read_text()
