"""The verifier's own robustness: no file stops the batch, nothing outlives the run.

Real `jaxmigrate run` subprocesses on real trees: a notebook with the README's legacy cells, symbolic
link loops and a link to a dataset outside the tree (issue 17, item 8); runs killed by signals
while `main()` hangs, `--timeout` on notebooks (item 9); the network sandbox (issue 20).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from clitools import cli_env, command, jm

from jaxmigrate.verify.lifetime import GUARD, sweep

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/legacy_project/legacy_project/sharded.py"
README_CELLS = [
    """import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import PartitionSpec as P
from jax.experimental.maps import Mesh
from jax.experimental.pjit import pjit
""",
    "def layer(x, w):\n    return jnp.tanh(x @ w)\n",
    """devices = np.array(jax.devices()[:8]).reshape(4, 2)
mesh = Mesh(devices, ('data', 'model'))
x = np.ones((16, 8), np.float32)
w = np.full((8, 4), 0.5, np.float32)
with mesh:
    f = pjit(layer, in_axis_resources=(P('data', None), P(None, 'model')),
             out_axis_resources=P('data', 'model'))
    y = f(x, w)
print(y.sum())
""",
]


def notebook(cells: list[str]) -> str:
    document: dict[str, Any] = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": cell,
            }
            for cell in cells
        ],
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


def report(path: Path) -> dict[str, dict[str, Any]]:
    """Return the report's files by their base name."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {Path(f["path"]).name: f for f in data["files"]}


def test_a_notebook_with_the_readme_cells_does_not_stop_the_batch(tmp_path: Path) -> None:
    tree = tmp_path / "project"
    tree.mkdir()
    (tree / "train.ipynb").write_text(notebook(README_CELLS), encoding="utf-8")
    shutil.copyfile(EXAMPLE, tree / "beside.py")
    proc = jm(
        "run",
        "--allow-dirty",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
    )
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr
    assert "jax.set_mesh(mesh)" in (tree / "beside.py").read_text(encoding="utf-8")
    files = report(tmp_path / "r.json")
    assert files["beside.py"]["bucket"] == "changed"
    sites = {s["code"]: s for s in files["train.ipynb"]["sites"]}
    assert sites["JM201"]["status"] == "unverified"
    assert "internal" not in sites["JM201"]["details"]["verification"]


def test_symlink_loops_and_a_dataset_outside_the_tree(tmp_path: Path) -> None:
    """Loops are skipped; a folder outside the tree is read where it is, never copied."""
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "blob.bin").write_bytes(b"\x01" * (4 << 20))
    seen = tmp_path / "seen.txt"
    tree = tmp_path / "project"
    tree.mkdir()
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "def main():\n",
        "def main():\n"
        "    import os\n"
        "    blob = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'blob.bin')\n"
        f"    with open({str(seen)!r}, 'a') as log:\n"
        "        log.write(os.path.realpath(blob) + '\\n')\n",
    )
    (tree / "sharded.py").write_text(text, encoding="utf-8")
    os.symlink("self.py", tree / "self.py")
    os.symlink(".", tree / "loop")
    os.symlink(data, tree / "data")
    proc = jm(
        "run",
        "--allow-dirty",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
    )
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    files = report(tmp_path / "r.json")
    assert files["self.py"]["bucket"] == "skipped"
    sites = {s["code"]: s for s in files["sharded.py"]["sites"]}
    assert sites["JM201"]["status"] == "verified", sites["JM201"]
    assert "jax.set_mesh(mesh)" in (tree / "sharded.py").read_text(encoding="utf-8")
    read = seen.read_text(encoding="utf-8").split()
    assert len(read) >= 2  # both sides ran main()
    assert set(read) == {str((data / "blob.bin").resolve())}  # the dataset itself, not a copy


HANGING_MAIN = """def main():
    import os, subprocess, sys, time
    escaped = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    with open(os.environ["JM_TEST_PIDS"], "a") as log:
        log.write(f"{os.getpid()} {escaped.pid}\\n")
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Return whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def below(pid: int) -> set[int]:
    """Return every process below `pid`, from /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as handle:
                    parents[int(name)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


# Start a command with SIGINT's default action, as a shell starts its foreground jobs. A shell
# without job control starts a background job with SIGINT ignored (`pytest ... &` in a script,
# some CI runners), a child inherits it, and a process started with SIGINT ignored rightly keeps
# ignoring it (jaxmigrate's verification does, as `nohup` expects): without this, the SIGINT
# tests timed out on a clean clone whose `.ci/run` ran in the background. (`exec` keeps the
# default action; `preexec_fn` is unsafe in a process with threads, as pytest-xdist's are.)
AS_A_FOREGROUND_JOB = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def hanging_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], set[int], Path]:
    """Start `jaxmigrate run --dry-run` on a module whose `main()` hangs (and has started a child
    in a session of its own); return the run, every process below it, and its TMPDIR once
    `main()` runs."""
    tree = tmp_path / "project"
    tree.mkdir()
    text = EXAMPLE.read_text(encoding="utf-8").replace("def main():\n", HANGING_MAIN, 1)
    (tree / "hang.py").write_text(text, encoding="utf-8")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    pids = tmp_path / "pids.txt"
    env = cli_env(JM_TEST_PIDS=str(pids), TMPDIR=str(scratch))
    run = subprocess.Popen(
        [sys.executable, "-c", AS_A_FOREGROUND_JOB, *command("run", "--dry-run", ".")],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: SIGINT goes to the group, as from a terminal
    )
    deadline = time.monotonic() + 240
    while not (pids.exists() and pids.read_text().strip()):
        assert run.poll() is None and time.monotonic() < deadline, "main() never ran"
        time.sleep(0.2)
    worker, escaped = map(int, pids.read_text().split()[:2])
    started = below(run.pid) | {escaped}
    assert worker in started and escaped in started
    assert list(scratch.glob("jaxmigrate-verify-*"))
    return run, started, scratch


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_killed_run_leaves_nothing_running(tmp_path: Path, number: signal.Signals) -> None:
    """Killed while `main()` hangs (and has started a child in a session of its own)."""
    run, started, scratch = hanging_run(tmp_path)
    began = time.monotonic()
    if number == signal.SIGINT:
        os.killpg(run.pid, number)
    else:
        os.kill(run.pid, number)
    _, err = run.communicate(timeout=60)
    quit_in = time.monotonic() - began
    assert run.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}.get(number, -number), err
    deadline = time.monotonic() + 10  # a guard notices its parent's death within a second
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in started if alive(p)]
    left = list(scratch.glob("jaxmigrate-verify-*"))
    if number != signal.SIGKILL:
        assert quit_in < 20, quit_in
        assert not left
        return
    # SIGKILL leaves the scratch folder: the next run removes it, as its owner is dead
    assert len(left) == 1 and (left[0] / "owner").exists()
    other = scratch / "jaxmigrate-verify-notours"  # no owner file: never touched
    other.mkdir()
    live = scratch / "jaxmigrate-verify-live"  # a live owner (this test): never touched
    live.mkdir()
    (live / "owner").write_text(f"{os.getpid()} \n")
    assert sweep(scratch) == left
    assert not left[0].exists() and other.exists() and live.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux's")
def test_a_sigint_the_kernel_hands_to_another_thread_still_stops_the_run(tmp_path: Path) -> None:
    """The kernel may hand a process's SIGINT (Ctrl-C, or SIGINT to its group) to any of its
    threads that does not block it; Python runs handlers on the main thread only, between
    bytecodes. While verification waits for its workers (lane threads), the main thread must
    not sleep in the kernel until they answer: a SIGINT taken by a lane thread stopped the run
    only when the hanging `main()` timed out (under pytest-xdist, the killed-run test's SIGINT)."""
    import ctypes

    run, started, scratch = hanging_run(tmp_path)
    others = [int(t) for t in os.listdir(f"/proc/{run.pid}/task") if int(t) != run.pid]
    assert others, "verification waits for its workers on threads of its own"
    tgkill = 234 if os.uname().machine == "x86_64" else 131  # aarch64
    libc = ctypes.CDLL(None, use_errno=True)
    began = time.monotonic()
    assert libc.syscall(tgkill, run.pid, others[0], signal.SIGINT) == 0  # not the main thread
    try:
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    quit_in = time.monotonic() - began
    assert run.returncode == 130, err
    assert quit_in < 20, quit_in
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in started if alive(p)]
    assert not list(scratch.glob("jaxmigrate-verify-*"))


def test_verification_has_no_network(tmp_path: Path) -> None:
    """A unit that connects to a port on this machine does not reach it; a download is refused
    with that reason, not made."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    tree = tmp_path / "project"
    tree.mkdir()
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "def main():\n",
        "def main():\n"
        "    import socket\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
        "    except OSError:\n"
        "        pass\n",
        1,
    )
    (tree / "local.py").write_text(text, encoding="utf-8")
    download = EXAMPLE.read_text(encoding="utf-8").replace(
        "def main():\n",
        "def main():\n"
        "    import urllib.request\n"
        "    urllib.request.urlopen('http://example.com/data.npy', timeout=20).read()\n",
        1,
    )
    (tree / "download.py").write_text(download, encoding="utf-8")
    proc = jm(
        "run", "--dry-run", "--format", "json", "--report", str(tmp_path / "r.json"), ".", cwd=tree
    )
    arrived = []
    try:
        while True:
            arrived.append(listener.accept())
    except TimeoutError:
        pass
    finally:
        listener.close()
    assert not arrived, "a verified unit reached a port on the host"
    files = report(tmp_path / "r.json")
    local = {s["code"]: s for s in files["local.py"]["sites"]}["JM201"]
    assert local["status"] == "verified", local  # loopback inside the sandbox works
    fetched = {s["code"]: s for s in files["download.py"]["sites"]}["JM201"]
    assert fetched["status"] == "unverified", fetched
    assert fetched["details"]["verification"].startswith(
        "the code tried to reach the network, which verification blocks"
    ), fetched
    assert proc.returncode == 0, proc.stderr


def test_timeout_bounds_a_notebook_run(tmp_path: Path) -> None:
    tree = tmp_path / "project"
    tree.mkdir()
    cells = [*README_CELLS[:2], "import time\ntime.sleep(600)\n", README_CELLS[2]]
    cells[0] = cells[0].replace(
        "from jax.experimental import PartitionSpec as P\n",
        "from jax.sharding import PartitionSpec as P\n",
    )
    (tree / "hang.ipynb").write_text(notebook(cells), encoding="utf-8")
    began = time.monotonic()
    proc = jm(
        "run",
        "--dry-run",
        "--timeout",
        "10",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
    )
    took = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    site = {s["code"]: s for s in report(tmp_path / "r.json")["hang.ipynb"]["sites"]}["JM201"]
    assert site["status"] == "unverified"
    assert "timed out after 10 s" in site["details"]["verification"], site
    assert took < 90, took


def test_a_timeout_spent_on_huge_outputs_names_its_cause(tmp_path: Path) -> None:
    """A million small dicts: the code returns in seconds, the outputs take the rest."""
    tree = tmp_path / "project"
    tree.mkdir()
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "        return f(x, w)\n",
        "        y = f(x, w)\n"
        "    return [{'i': i, 'v': i * 0.5, 'name': 'row'} for i in range(1_000_000)] + [y]\n",
    )
    (tree / "big.py").write_text(text, encoding="utf-8")
    proc = jm(
        "run",
        "--dry-run",
        "--timeout",
        "15",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
    )
    assert proc.returncode == 0, proc.stderr
    site = {s["code"]: s for s in report(tmp_path / "r.json")["big.py"]["sites"]}["JM201"]
    assert site["status"] == "unverified", site
    why = site["details"]["verification"]
    assert why.startswith(
        "the original timed out after 15 s, but not in the code, which returned in"
    )
    assert "comparing its outputs" in why


def test_writes_outside_the_copies_are_reported(tmp_path: Path) -> None:
    """By absolute path, into the project itself and into the home folder."""
    tree = tmp_path / "project"
    tree.mkdir()
    user_home = tmp_path / "home"
    user_home.mkdir()
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        "def main():\n",
        "def main():\n"
        f"    open({str(tree / 'leak.txt')!r}, 'a').write('x')\n"
        f"    open({str(user_home / 'downloaded.npy')!r}, 'a').write('x')\n",
        1,
    )
    (tree / "writer.py").write_text(text, encoding="utf-8")
    proc = jm(
        "run",
        "--dry-run",
        "--format",
        "json",
        "--report",
        str(tmp_path / "r.json"),
        ".",
        cwd=tree,
        env=cli_env(HOME=str(user_home)),
    )
    assert proc.returncode == 0, proc.stderr
    site = {s["code"]: s for s in report(tmp_path / "r.json")["writer.py"]["sites"]}["JM201"]
    assert "files outside its copies changed" in site["details"]["verification"], site
    assert site["details"]["outside_writes"] == [
        f"created {tree / 'leak.txt'}",
        f"created {user_home / 'downloaded.npy'}",
    ]


def test_a_guard_signalled_again_while_stopping_still_kills_its_command() -> None:
    """jaxmigrate sends a guard SIGTERM more than once as it stops (every child at once, then
    each child, then the death signal as it exits): a second one must not end the guard before
    it killed its command (6 commands of 30 survived such a burst before)."""
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    survivors = []
    for _ in range(20):
        guard = subprocess.Popen(
            [sys.executable, "-I", "-S", str(GUARD), "--parent", str(os.getpid()), "--",
             sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        assert guard.stdout is not None
        child = int(guard.stdout.readline())
        guard.stdout.close()
        end = time.monotonic() + 0.3
        while time.monotonic() < end and guard.poll() is None:
            try:
                os.kill(guard.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
        guard.wait(timeout=30)
        deadline = time.monotonic() + 2
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(child):
            survivors.append(child)
            os.kill(child, signal.SIGKILL)
    assert not survivors
