"""What user code can do to a worker: each fault is contained and reported, never raised.

Hangs, segfaults, aborts, sys.exit, os._exit, memory hogs, forks, prints and file writes, in the
original or only in the rewrite. All cases run in one verification with a short timeout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from verify_cases import Case, faithful, pmapped, tree_digest, verify_cases

from jaxmigrate.model import Status

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)
VERIFIED, FAILED, UNVERIFIED = Status.VERIFIED, Status.FAILED, Status.UNVERIFIED
GIB = 2**30

FAULTS = {
    "hang": "import time; time.sleep(600)",
    "segfault": "import ctypes; ctypes.string_at(0)",
    "abort": "import os; os.abort()",
    "sys_exit": "import sys; sys.exit(3)",
    "os_exit": "import os; os._exit(7)",
    "numpy_hog": "import numpy; numpy.ones(1 << 34, numpy.uint8)",
}
# Outside any trace, so that XLA really allocates.
JAX_HOG = (
    faithful("return x * 2").replace("step = jax.jit", "_step = jax.jit")
    + """

def step(x):
    jax.device_put(np.broadcast_to(np.uint8(1), (1 << 33,))).block_until_ready()
    return _step(x)
"""
)
FORK = """
import os
pid = os.fork()
if pid == 0:
    with open(os.environ["JM_TEST_PIDS"], "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    import time; time.sleep(SLEEP)
"""
MESSY = """
import sys
from pathlib import Path
print("user output on stdout")
sys.stdin.read()
Path("written.txt").write_text("from the worker")
Path(__file__).with_name("next_to_module.txt").write_text("from the worker")
"""


def with_fault(fault: str) -> str:
    return f"{fault}\nreturn x * 2"


CASES = (
    [
        Case(f"rewrite_{name}", pmapped("return x * 2"), faithful(with_fault(code)), FAILED, why)
        for name, code, why in [
            ("hang", FAULTS["hang"], "the rewrite timed out after 5 s (the original did not)"),
            ("segfault", FAULTS["segfault"], "the rewrite crashed (SIGSEGV)"),
            ("abort", FAULTS["abort"], "the rewrite crashed (SIGABRT)"),
            ("sys_exit", FAULTS["sys_exit"], "SystemExit: the code called sys.exit(3)"),
            ("os_exit", FAULTS["os_exit"], "the rewrite exited with status 7"),
            ("numpy_hog", FAULTS["numpy_hog"], "MemoryError"),
        ]
    ]
    + [
        Case("rewrite_jax_hog", pmapped("return x * 2"), JAX_HOG, FAILED, "the rewrite"),
    ]
    + [
        Case(
            f"original_{name}", pmapped(with_fault(code)), faithful("return x * 2"), UNVERIFIED, why
        )
        for name, code, why in [
            ("hang", FAULTS["hang"], "the original timed out after 5 s"),
            ("segfault", FAULTS["segfault"], "the original crashed (SIGSEGV)"),
            ("sys_exit", FAULTS["sys_exit"], "the original cannot run: SystemExit"),
        ]
    ]
    + [
        Case(
            "rewrite_exits_on_import",
            pmapped("return x * 2"),
            "import sys\nsys.exit(1)\n" + faithful("return x * 2"),
            FAILED,
            "the rewrite does not import: SystemExit",
        ),
        Case(
            "original_raises_on_import",
            "raise RuntimeError('no GPU')\n" + pmapped("return x * 2"),
            faithful("return x * 2"),
            UNVERIFIED,
            "the original cannot run: RuntimeError: no GPU",
        ),
        Case(
            "fork_child_lingers",
            pmapped(FORK.replace("SLEEP", "300") + "return x * 2"),
            faithful(FORK.replace("SLEEP", "300") + "return x * 2"),
            VERIFIED,
        ),
        Case(
            "fork_child_returns",
            pmapped(FORK.replace("SLEEP", "0") + "return x * 2"),
            faithful(FORK.replace("SLEEP", "0") + "return x * 2"),
            VERIFIED,
        ),
        Case(
            "prints_reads_stdin_writes_files",
            pmapped(MESSY + "return x * 2"),
            faithful(MESSY + "return x * 2"),
            VERIFIED,
        ),
    ]
)


def running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict, list[int]]:
    base = tmp_path_factory.mktemp("faults")
    root = base / "project"
    pids = base / "forked.txt"
    pids.write_text("")
    os.environ["JM_TEST_PIDS"] = str(pids)
    try:
        root.mkdir()
        for case in CASES:
            (root / case.path).write_text(case.original)
        before = tree_digest(root)
        verdicts = verify_cases(CASES, root, timeout=5.0, memory_limit=4 * GIB)
    finally:
        del os.environ["JM_TEST_PIDS"]
    return before, tree_digest(root), verdicts, [int(p) for p in pids.read_text().split()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fault_is_reported(case: Case, outcome: tuple) -> None:
    verdict = outcome[2][case.name]
    assert verdict.status is case.expect, f"{verdict.reason}\n{verdict.details}"
    assert case.reason in verdict.reason, verdict.reason


def test_the_users_tree_is_never_written(outcome: tuple) -> None:
    before, after, _, _ = outcome
    assert before == after
    assert set(after) == {c.path for c in CASES}


def test_forked_processes_are_gone(outcome: tuple) -> None:
    pids = outcome[3]
    assert len(pids) >= 2, "the fork cases did not fork"
    assert not [pid for pid in pids if running(pid)]


@pytest.mark.parametrize("python", ["missing", "without_jax"])
def test_an_interpreter_that_cannot_run_workers_leaves_sites_unverified(
    python: str, tmp_path: Path
) -> None:
    fake = tmp_path / "python"
    if python == "without_jax":
        fake.write_text(
            "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'jax'\" >&2\nexit 1\n"
        )
        fake.chmod(0o755)
    case = Case("plain", pmapped("return x * 2"), faithful("return x * 2"), UNVERIFIED)
    verdict = verify_cases([case], tmp_path / "project", python=str(fake))["plain"]
    assert verdict.status is UNVERIFIED
    assert "could not start a worker" in verdict.reason
    if python == "without_jax":
        assert "No module named 'jax'" in verdict.reason
