"""Progress on standard error: plain lines when it is not a terminal, a live bar when it is."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
from pathlib import Path

from clitools import command, jm
from rich.console import Console
from test_cli import LEGACY

from jaxmigrate.model import Bucket, FileResult
from jaxmigrate.ui.progress import line, track


def make_tree(root: Path, files: int) -> None:
    for i in range(files):
        (root / f"m{i:03d}.py").write_text(LEGACY if i % 50 == 0 else "import jax\n")


def test_plain_lines_every_hundred_files(tmp_path: Path) -> None:
    make_tree(tmp_path, 250)
    # one worker: the files in discovery order, so the first 100 hold 2 of the 5 sites
    proc = jm("check", "--no-cache", "--jobs", "1", ".", cwd=tmp_path)
    lines = [x for x in proc.stderr.splitlines() if x.startswith("jaxmigrate: ")]
    assert lines[0].startswith("jaxmigrate: 100/250 files, 2 sites found, ") and "left" in lines[0]
    assert lines[-1].startswith("jaxmigrate: 250/250 files, 5 sites found, ")
    assert "left" not in lines[-1]
    assert len(lines) in (2, 3)  # 200/250 only when a second went by since the first line
    assert "jaxmigrate: " not in proc.stdout  # progress never mixes into results


def test_lines_are_counted_and_throttled() -> None:
    results = [FileResult(f"f{i}.py", Bucket.UNCHANGED) for i in range(500)]
    every = Console(file=io.StringIO(), width=120)
    assert list(track(results, 500, every, gap=0.0)) == results
    counts = [x.split(",")[0] for x in every.file.getvalue().splitlines()]  # type: ignore[attr-defined]
    assert counts == [f"jaxmigrate: {n}/500 files" for n in (100, 200, 300, 400, 500)]
    throttled = Console(file=io.StringIO(), width=120)
    assert list(track(results, 500, throttled, gap=3600.0)) == results
    counts = [x.split(",")[0] for x in throttled.file.getvalue().splitlines()]  # type: ignore[attr-defined]
    assert counts == ["jaxmigrate: 100/500 files", "jaxmigrate: 500/500 files"]


def test_a_small_batch_prints_no_progress(tmp_path: Path) -> None:
    make_tree(tmp_path, 3)
    assert "files, " not in jm("check", ".", cwd=tmp_path).stderr


def test_slow_files_get_a_line_by_time() -> None:
    console = Console(file=io.StringIO(), width=120)
    results = [FileResult(f"f{i}.py", Bucket.UNCHANGED) for i in range(3)]
    assert list(track(results, 3, console, every=100, seconds=0.0)) == results
    printed = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert [x.split(",")[0] for x in printed] == [
        "jaxmigrate: 1/3 files",
        "jaxmigrate: 2/3 files",
        "jaxmigrate: 3/3 files",
    ]
    assert line(10, 40, 7, 2.0) == "jaxmigrate: 10/40 files, 7 sites found, 2.0s, about 6s left"


def test_bar_on_a_terminal_yields_every_result_unchanged() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    results = [FileResult(f"f{i}.py", Bucket.UNCHANGED) for i in range(5)]
    assert list(track(results, 5, console)) == results
    assert "migrating" in console.file.getvalue()  # type: ignore[attr-defined]


def test_bar_in_a_real_terminal(tmp_path: Path) -> None:
    make_tree(tmp_path, 150)
    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        command("check", "--no-cache", "."),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=secondary,
        env=env,
    )
    os.close(secondary)
    seen = b""
    while True:
        ready, _, _ = select.select([primary], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break  # the child closed the terminal
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=120)
    os.close(primary)
    text = seen.decode(errors="replace")
    assert "migrating" in text and "sites found" in text and "/150" in text
    assert "jaxmigrate: 100/150 files" not in text  # no plain lines on a terminal
