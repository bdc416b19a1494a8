"""Bad input, as a user's tree holds it: real files, real `jaxmigrate` subprocesses.

Every bad file ends in its bucket with one clear line, is left byte-for-byte as it was, and
never stops the other files of the run from being migrated. Odd but valid files (BOM, CRLF,
mixed newlines, tabs, 5 MB, empty) are migrated keeping every byte around the sites.

Permission cases need the permission bits to bind. Tests run as root in CI, where they do not
(root reads and writes any file): there the command runs with root's two overriding
capabilities dropped (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), which makes root as bound by the
bits as any user; where that cannot be done, those tests are skipped and say why.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import clitools
import pytest

LEGACY = "from jax.experimental.maps import Mesh\n\nmesh = Mesh(devices, ('x',))\n"
OLD, NEW = b"jax.experimental.maps", b"jax.sharding"
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def jm(
    *args: str, cwd: Path, preexec_fn: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    return clitools.jm(*args, cwd=cwd, columns=250, timeout=600, preexec_fn=preexec_fn)


def report_of(path: Path) -> dict[str, dict]:
    return {f["path"]: f for f in json.loads(path.read_text())["files"]}


def problem_lines(stdout: str) -> dict[str, str]:
    """The `path: bucket: reason` line printed for each skipped or failed file."""
    out = {}
    for line in stdout.splitlines():
        head, sep, rest = line.partition(": ")
        if sep and rest.split(":", 1)[0] in ("skipped", "failed"):
            out[head] = rest
    return out


def big_generated_module() -> bytes:
    """5 MB: a generated data module (long string constants) with one legacy import."""
    chunk = "0123456789abcdef" * 4096  # 64 KiB per line
    lines = [f'CHUNK_{i} = "{chunk}"\n' for i in range(80)]
    return (LEGACY + "".join(lines)).encode()


# name -> (bytes, expected bucket, what the one line must say); None: not a regular file.
BAD: dict[str, tuple[bytes | None, str, str]] = {
    "syntax_error.py": ((LEGACY + "def f(:\n").encode(), "failed", "cannot parse: line 4"),
    "python2.py": (
        (LEGACY + "print 'hello'\n").encode(),
        "failed",
        "cannot parse: line 4, column 1: Missing parentheses in call to 'print'",
    ),
    "python2_module.py": (
        (LEGACY + "if a <> b:\n    raise ValueError, `a`\n").encode(),
        "failed",
        "cannot parse: line 4",
    ),
    "latin1_no_cookie.py": (
        LEGACY.encode() + b"name = 'caf\xe9'\n",
        "failed",
        "cannot be decoded as utf-8",
    ),
    "latin1_first_line.py": (
        b"# caf\xe9\n" + LEGACY.encode(),
        "failed",
        "invalid or missing encoding declaration",
    ),
    "unknown_cookie.py": (
        b"# -*- coding: klingon -*-\n" + LEGACY.encode(),
        "failed",
        "unknown encoding: klingon",
    ),
    "nul_byte.py": (LEGACY.encode() + b"x = '\x00'\n", "failed", "contains a NUL byte"),
    "deeply_nested.py": (
        (LEGACY + "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n").encode(),
        "failed",
        "too deeply nested",
    ),
    "not_json.ipynb": (b"{ this is not json", "failed", "not valid notebook JSON"),
    "loop.py": (None, "skipped", "broken or looping symbolic link"),
    "escape.py": (None, "skipped", "symbolic link leaves the tree"),
    "fifo.py": (None, "skipped", "not a regular file"),
    "read_only.py": (LEGACY.encode(), "failed", "read-only file; not written"),
}
# name -> bytes; each must come out as the same bytes with the legacy import renamed.
ODD_BUT_FINE: dict[str, bytes] = {
    "bom.py": b"\xef\xbb\xbf" + LEGACY.encode(),
    "crlf.py": LEGACY.replace("\n", "\r\n").encode(),
    "mixed_newlines.py": b"from jax.experimental.maps import Mesh\r\nx = 1\nmesh = Mesh(d, ('x',))\r\n",
    "tabs.py": b"from jax.experimental.maps import Mesh\nif True:\n\tmesh = Mesh(d, ('x',))\n",
    "big.py": big_generated_module(),
    "good.py": LEGACY.encode(),
}


def make_tree(root: Path) -> Path:
    tree = root / "tree"
    tree.mkdir()
    outside = root / "outside"
    outside.mkdir()
    (outside / "legacy.py").write_text(LEGACY)
    for name, (data, _, _) in BAD.items():
        if data is not None:
            (tree / name).write_bytes(data)
    (tree / "loop.py").symlink_to("loop.py")
    (tree / "escape.py").symlink_to(outside / "legacy.py")
    os.mkfifo(tree / "fifo.py")
    (tree / "read_only.py").chmod(0o444)
    for name, data in ODD_BUT_FINE.items():
        (tree / name).write_bytes(data)
    (tree / "empty.py").write_bytes(b"")
    return tree


def snapshot(tree: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in tree.iterdir()
        if p.is_file() and not p.is_symlink() and not stat.S_ISFIFO(p.stat().st_mode)
    }


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_each_bad_file_fails_alone_and_stays_untouched(tmp_path: Path, jobs: str) -> None:
    tree = make_tree(tmp_path)
    before = snapshot(tree)
    outside = (tmp_path / "outside" / "legacy.py").read_bytes()
    proc = jm(
        "run",
        "--no-verify",
        "--allow-dirty",
        "--jobs",
        jobs,
        "--report",
        "report.json",
        "tree",
        "missing.py",
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "Traceback" not in output
    report = report_of(tmp_path / "report.json")
    lines = problem_lines(proc.stdout)
    expected = {f"tree/{name}": (bucket, says) for name, (_, bucket, says) in BAD.items()}
    expected["missing.py"] = ("failed", "no such file or directory")
    for path, (bucket, says) in expected.items():
        assert report[path]["bucket"] == bucket, (path, report[path])
        assert says in report[path]["reason"], (path, report[path]["reason"])
        assert "\n" not in report[path]["reason"]
        assert lines[path] == f"{bucket}: {report[path]['reason']}", (path, lines.get(path))
    after = snapshot(tree)
    for name, (data, _, _) in BAD.items():
        if data is not None:
            assert after[name] == before[name], f"{name} was written"
    assert stat.S_IMODE((tree / "read_only.py").stat().st_mode) == 0o444
    assert (tmp_path / "outside" / "legacy.py").read_bytes() == outside
    for name, data in ODD_BUT_FINE.items():
        assert report[f"tree/{name}"]["bucket"] == "changed", name
        assert after[name] == data.replace(OLD, NEW), f"{name}: bytes around the site changed"
    assert report["tree/empty.py"]["bucket"] == "unchanged" and after["empty.py"] == b""
    leftovers = sorted(set(after) - set(before))
    assert not leftovers, leftovers


def test_check_reports_bad_files_and_writes_nothing(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    before = snapshot(tree)
    proc = jm("check", "tree", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tree/python2.py: failed: cannot parse" in proc.stdout
    assert snapshot(tree) == before


def test_skipped_files_alone_do_not_fail_the_run(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "good.py").write_text(LEGACY)
    (tree / "loop.py").symlink_to("loop.py")
    os.mkfifo(tree / "fifo.py")
    proc = jm("run", "--no-verify", "--allow-dirty", "tree", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tree/loop.py: skipped: broken or looping symbolic link" in proc.stdout
    assert (tree / "good.py").read_bytes() == LEGACY.encode().replace(OLD, NEW)


def test_no_python_file_at_all_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("jax.pmap\n")
    proc = jm("run", "--no-verify", ".", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no Python files or notebooks found" in proc.stderr and "Traceback" not in proc.stderr


def test_a_directory_that_cannot_be_listed_is_reported(tmp_path: Path, bound: BoundRunner) -> None:
    tree = tmp_path / "tree"
    (tree / "locked").mkdir(parents=True)
    (tree / "locked" / "inner.py").write_text(LEGACY)
    (tree / "good.py").write_text(LEGACY)
    (tree / "locked").chmod(0)
    try:
        proc = bound("run", "--no-verify", "--allow-dirty", "tree", cwd=tmp_path)
    finally:
        (tree / "locked").chmod(0o755)
    assert "tree/locked: skipped: cannot list directory: Permission denied" in proc.stdout
    assert (tree / "locked" / "inner.py").read_text() == LEGACY
    assert (tree / "good.py").read_bytes() == LEGACY.encode().replace(OLD, NEW)


# --- Permissions that bind ------------------------------------------------------------------


def drop_root_overrides() -> None:
    """In the child before exec: drop the capabilities that let root ignore permission bits."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


BoundRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def bound(tmp_path: Path) -> BoundRunner:
    """Run jaxmigrate so that permission bits bind it (as root: without its overrides)."""
    if os.name != "posix":
        pytest.skip("permission bits are POSIX")
    if os.geteuid() != 0:
        return jm
    probe = tmp_path / "probe"
    probe.write_text("secret")
    probe.chmod(0)
    try:
        check = subprocess.run(
            [sys.executable, "-c", f"open({str(probe)!r}).read()"],
            preexec_fn=drop_root_overrides,
            capture_output=True,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE here: {exc}")
    finally:
        probe.unlink()
    if check.returncode == 0:
        pytest.skip("running as root and dropping CAP_DAC_OVERRIDE did not make bits bind")

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return jm(*args, cwd=cwd, preexec_fn=drop_root_overrides)

    return run


def test_unreadable_file(tmp_path: Path, bound: BoundRunner) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "unreadable.py").write_text(LEGACY)
    (tree / "unreadable.py").chmod(0)
    (tree / "good.py").write_text(LEGACY)
    proc = bound("run", "--no-verify", "--allow-dirty", "tree", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tree/unreadable.py: failed: cannot be read: Permission denied" in proc.stdout
    (tree / "unreadable.py").chmod(0o644)
    assert (tree / "unreadable.py").read_text() == LEGACY
    assert (tree / "good.py").read_bytes() == LEGACY.encode().replace(OLD, NEW)


@pytest.mark.parametrize("who", ["as the test runs", "bound by the bits"])
def test_read_only_file(tmp_path: Path, who: str, request: pytest.FixtureRequest) -> None:
    """A file without write bits is never written, even by root, who could."""
    run = request.getfixturevalue("bound") if who == "bound by the bits" else jm
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "read_only.py").write_text(LEGACY)
    (tree / "read_only.py").chmod(0o444)
    (tree / "good.py").write_text(LEGACY)
    proc = run("run", "--no-verify", "--allow-dirty", "tree", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tree/read_only.py: failed: read-only file; not written" in proc.stdout
    assert (tree / "read_only.py").read_text() == LEGACY
    assert stat.S_IMODE((tree / "read_only.py").stat().st_mode) == 0o444
    assert (tree / "good.py").read_bytes() == LEGACY.encode().replace(OLD, NEW)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("x = " + "(" * 5000 + "1" + ")" * 5000 + "\n", "too deeply nested for the parser"),
        ("x = " + "-" * 200_000 + "1\n", "too deeply nested for the parser"),
        ("import jax\n\nx = jax.pmap(f)(y)\n", "internal error: RecursionError: the analysis"),
    ],
    ids=["parentheses", "operators", "parses"],
)
def test_a_recursion_error_says_whose_it_is(text: str, reason: str) -> None:
    """Running out of stack on code Python cannot parse is the file's nesting; on code it
    parses, it is an analysis of ours that recursed without end (`_flow._drawn` did, on a batch
    carried through a loop), and the file says so instead of blaming its nesting."""
    from jaxmigrate.pipeline.files import recursion_reason

    assert recursion_reason("m.py", text).startswith(reason)
