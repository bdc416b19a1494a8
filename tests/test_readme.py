"""The README's sample sessions are real: each block that starts with `$ cd examples/...` is run
as written, on a copy of `examples/`, and its output must be what the block shows.

In a block, a line `...` stands for any number of lines and `[...]` in a line for any text; the
rest is compared line by line (trailing spaces aside). A JAX version in a sample (`on JAX
0.10.2`, printed by the 3.11 leg's JAX) stands for the version the test runs with: the 3.13 leg
of `.ci/run` runs these sessions on JAX 0.12, whose messages differ in that number only. A block
showing a made-up tree (the progress lines of a 2,000-file repository) does not start with
`$ cd examples/` and is not run. `pytest --update-fixtures` does not rewrite the README: a sample
that drifted is fixed by hand, from the real output this test prints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import cli_env
from conftest import jax_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# `JAX 0.10.2` as `re.escape` writes it: the version a sample was printed with
JAX_VERSION = re.compile(r"JAX(?:\\)? [0-9]+(?:\\\.[0-9]+)+")
SESSION = re.compile(r"^\$ cd (examples/[\w/.-]+) && (.+)$")


def sessions() -> list[tuple[str, str, str]]:
    """Return (folder, command, shown output) of each runnable block of the README."""
    found = []
    for block in FENCE.findall(README.read_text(encoding="utf-8")):
        first, _, shown = block.partition("\n")
        match = SESSION.match(first)
        if match:
            found.append((match.group(1), match.group(2), shown))
    return found


def pattern(shown: str) -> re.Pattern[str]:
    """Return the regex the real output must match in full (see the module docstring)."""
    parts = []
    for line in shown.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            text = re.escape(line.rstrip()).replace(re.escape("[...]"), ".*?")
            text = JAX_VERSION.sub(r"JAX\ [0-9][0-9.]*", text)
            parts.append(text + r"\n")
    return re.compile("".join(parts), re.DOTALL)


def normalized(output: str) -> str:
    return "\n".join(line.rstrip() for line in output.rstrip("\n").split("\n")) + "\n"


def test_the_readme_has_sessions_to_check() -> None:
    commands = [command for _, command, _ in sessions()]
    assert any("--processes 2" in c for c in commands)
    assert any("--interactive" in c for c in commands)
    assert any("--verify-with" in c for c in commands)
    assert len(commands) >= 5


@pytest.mark.parametrize(
    ("folder", "command", "shown"), sessions(), ids=[c for _, c, _ in sessions()]
)
def test_a_readme_session_shows_what_the_command_prints(
    folder: str, command: str, shown: str, tmp_path: Path
) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**jax_env(), **cli_env()}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path / folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    real = normalized(proc.stdout)
    assert pattern(shown).fullmatch(real), (
        f"README.md's sample of `{command}` is not what it prints; the real output:\n{real}"
        f"\nstderr:\n{proc.stderr[-2000:]}"
    )


def test_the_readmes_libcst_command_runs_where_black_is_not_installed(tmp_path: Path) -> None:
    """The rule as a libcst codemod command, exactly as the README spells it."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"`(python -m libcst\.tool codemod [^`]*) PATH`", text)
    assert match, "the README shows no libcst command"
    target = tmp_path / "sharded.py"
    shutil.copy(ROOT / "examples" / "legacy_project" / "legacy_project" / "sharded.py", target)
    args = match.group(1).split()[1:]
    proc = subprocess.run(
        [sys.executable, *args, str(target)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "f = jax.jit(layer, in_shardings=" in target.read_text()


def test_the_readmes_pre_commit_example_pins_no_made_up_tag() -> None:
    """`rev: v0.1.0` named a tag the repository does not have."""
    text = README.read_text(encoding="utf-8")
    revs = re.findall(r"^\s*rev: (\S+)", text, re.MULTILINE)
    assert revs and all(r.startswith("<") for r in revs), revs
    assert "repo: local" in text
