"""`jaxmigrate explain` with pasted error text lands on the rule that fixes it (real CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clitools import jm

MESSAGE = (
    "callbacks are only supported in spmd computations when all mesh axes are partitioned "
    "manually (no partial automatic sharding)"
)


def explain(text: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return jm("explain", text, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "pasted",
    [
        MESSAGE,
        f"NotImplementedError: {MESSAGE}.",
        # as a terminal or a log wraps it
        (
            "NotImplementedError: callbacks are only supported in spmd computations when all "
            "mesh\naxes are partitioned manually (no partial automatic sharding)."
        ),
        (
            "callbacks are only supported in spmd computations when all mesh axes are\r\n"
            "    partitioned  manually\t(no partial automatic sharding)"
        ),
        # a part of it, in another case
        "when all mesh axes are partitioned manually",
        "NO PARTIAL AUTOMATIC SHARDING",
    ],
    ids=["message", "with-exception", "wrapped", "odd-whitespace", "part", "upper-case"],
)
def test_pasted_error_finds_the_callback_rule(pasted: str, tmp_path: Path) -> None:
    proc = explain(pasted, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.lstrip().startswith("JM203 partial-auto-callback"), out[:200]
    assert out.count("partial-auto-callback (unsafe)") == 1  # this rule, and only it
    for heading in ("Why", "Before", "After", "Safety", "Skips", "Verification"):
        assert heading in out
    assert 'axis_names={"model"}' in out  # the fix, shown


def test_code_and_name_explain_the_same_rule(tmp_path: Path) -> None:
    by_code, by_name = explain("JM203", tmp_path), explain("partial_auto_callback", tmp_path)
    assert by_code.returncode == by_name.returncode == 0
    assert by_code.stdout == by_name.stdout


def test_unrelated_text_is_a_usage_error(tmp_path: Path) -> None:
    proc = explain("segmentation fault in the flux capacitor", tmp_path)
    assert proc.returncode == 2
    assert "no rule matches" in proc.stderr
