"""`jaxmigrate run --interactive` on a real pseudo-terminal, driven by pexpect: single keys
without Enter, Enter for the default, Ctrl-D, and Ctrl-C in the middle of a file."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from clitools import command
from review_cases import PROMPT, SAFE, SECOND, jm, progress_file, rendered

pexpect = pytest.importorskip("pexpect")


def spawn(cwd: Path, *args: str, sigint: Any = signal.SIG_DFL) -> pexpect.spawn:
    """Start an interactive run on a new terminal, SIGINT's disposition set to `sigint` (as it
    is inherited: a job started in the background by a shell without job control ignores it)."""
    env = {**os.environ, "NO_COLOR": "1", "TERM": "xterm"}
    program, *argv = command("run", "--interactive", "--no-verify", *args)
    child = pexpect.spawn(
        program,
        argv,
        cwd=str(cwd),
        env=env,
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    return child


def answer(child: pexpect.spawn, where: str, key: str, *shown: str, default: str = "y") -> None:
    """Wait for the prompt numbered `where` (`[2/5]`) showing `shown`, then press `key`.

    The terminal gets colours and styles, so only text inside one styled span is matched.
    """
    child.expect_exact(where)
    for text in shown:
        child.expect_exact(text)
    child.expect_exact(f"(Enter = {default}) ")
    child.send(key)


def echoed(child: pexpect.spawn, key: str) -> None:
    """Expect `key` echoed right after the question (keys are read without terminal echo)."""
    child.expect_exact("\r\n")
    assert re.sub(r"\x1b\[[0-9;]*m", "", child.before) == key


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a.py").write_text(SECOND)  # one site
    (tmp_path / "b.py").write_text(SAFE)  # four sites
    return tmp_path


def test_a_terminal_session_reads_single_keys(tree: Path) -> None:
    child = spawn(tree, ".")
    answer(child, "[1/5]", "n", "a.py:3:5", "JM103", "-g = ")
    echoed(child, "n")
    answer(child, "[2/5]", "\r", "b.py:2:35", "JM101")  # Enter: the default, y
    echoed(child, "y")
    answer(child, "[3/5]", "?")
    child.expect_exact("skip this site and the rest of this file")
    child.expect_exact(PROMPT)
    child.send("y")
    answer(child, "[4/5]", "d")
    child.expect_exact("wrote b.py: 2 of 4 site(s) applied")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (tree / "a.py").read_text() == SECOND
    assert (tree / "b.py").read_text() == rendered(SAFE, [0, 1])
    assert not progress_file(tree).exists()


def test_ctrl_d_quits_like_q(tree: Path) -> None:
    child = spawn(tree, ".")
    answer(child, "[1/5]", "y")
    answer(child, "[2/5]", "\x04")
    child.expect_exact("quit: writing the sites accepted so far")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (tree / "a.py").read_text() == rendered(SECOND, [0])
    assert (tree / "b.py").read_text() == SAFE


def test_keys_typed_ahead_are_answers_not_lost(tree: Path) -> None:
    """Two keys at once: the second answers the next prompt (the terminal mode is changed for
    each key without discarding what was typed but not read yet)."""
    child = spawn(tree, ".")
    answer(child, "[1/5]", "yn", "a.py:3:5")
    child.expect_exact("wrote a.py: 1 of 1 site(s) applied")
    answer(child, "[3/5]", "q")  # [2/5] was answered by the "n" typed ahead
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (tree / "a.py").read_text() == rendered(SECOND, [0])
    assert (tree / "b.py").read_text() == SAFE


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_ctrl_c_leaves_no_half_written_file_and_keeps_the_progress(tree: Path, sigint: Any) -> None:
    child = spawn(tree, ".", sigint=sigint)
    answer(child, "[1/5]", "y")
    child.expect_exact("wrote a.py: 1 of 1 site(s) applied")
    answer(child, "[2/5]", "y")
    answer(child, "[3/5]", "n")
    child.expect_exact("[4/5]")
    child.expect_exact("(Enter = y) ")
    child.sendintr()  # Ctrl-C, through the terminal's line discipline
    child.expect_exact("interrupted: files already written are complete")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert (tree / "a.py").read_text() == rendered(SECOND, [0]), "finished before Ctrl-C"
    assert (tree / "b.py").read_text() == SAFE, "the file under review is not written"
    assert sorted(p.name for p in tree.iterdir()) == [".jaxmigrate_cache", "a.py", "b.py"]

    again = jm("--no-verify", ".", cwd=tree, stdin="y\nn\n")
    assert "resuming: 2 decision(s) remembered, 2 left to review" in again.stdout
    assert again.stdout.count(PROMPT) == 2
    assert (tree / "b.py").read_text() == rendered(SAFE, [0, 2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux's")
def test_ctrl_c_taken_by_the_engine_thread_still_interrupts_the_prompt(tree: Path) -> None:
    """The kernel may hand a process's SIGINT to any thread; Python runs handlers only on the
    main thread, which waits for a key: SIGINT sent to the engine's thread alone must still
    stop the review."""
    import ctypes

    child = spawn(tree, "--jobs", "1", ".")  # the engine in this process, on its thread
    answer(child, "[1/5]", "y")
    child.expect_exact("[2/5]")
    child.expect_exact("(Enter = y) ")
    others = [int(t) for t in os.listdir(f"/proc/{child.pid}/task") if int(t) != child.pid]
    assert others, "the engine runs on a thread of its own"
    tgkill = 234 if os.uname().machine == "x86_64" else 131  # aarch64
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(tgkill, child.pid, others[0], signal.SIGINT) == 0
    child.expect_exact("interrupted: files already written are complete")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert (tree / "b.py").read_text() == SAFE
