"""`jaxmigrate explain` with pasted error text lands on the rule that fixes it (real CLI)."""

from __future__ import annotations

import re
import subprocess
import sys
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


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "legacy_project" / "legacy_project"


def raised_by(path: Path) -> str:
    """Return the last line of the error running `path` raises on the installed JAX."""
    from conftest import jax_env

    proc = subprocess.run(
        [sys.executable, str(path)],
        check=False,
        capture_output=True,
        text=True,
        env=jax_env(),
        timeout=300,
    )
    assert proc.returncode != 0, f"{path.name} runs on this JAX: {proc.stdout[-300:]}"
    errors = [
        line for line in proc.stderr.splitlines() if re.match(r"\w+(Error|Exception): ", line)
    ]
    assert errors, proc.stderr[-500:]
    return errors[-1]


def test_the_errors_the_bundled_example_raises_find_their_rule(tmp_path: Path) -> None:
    """What a user sees running the example on today's JAX, pasted into `explain`: the
    placement module's removed helper, the sharded module's old import home, and once that is
    fixed, pjit's old keywords."""
    from jaxmigrate.model import Options
    from jaxmigrate.pipeline.engine import migrate_source

    sharded = (EXAMPLE / "sharded.py").read_text()
    imports_fixed = tmp_path / "sharded.py"
    imports_fixed.write_text(migrate_source(sharded, options=Options(select=("JM101",))).code)
    errors = {
        "JM104 device-put-replicated": raised_by(EXAMPLE / "placement.py"),
        "JM101 legacy-imports": raised_by(EXAMPLE / "sharded.py"),
        "JM103 pjit": raised_by(imports_fixed),
    }
    assert (
        "cannot import name 'PartitionSpec' from 'jax.experimental'"
        in errors["JM101 legacy-imports"]
    )
    assert "jax.device_put_replicated is deprecated" in errors["JM104 device-put-replicated"]
    assert "unexpected keyword argument 'in_axis_resources'" in errors["JM103 pjit"]
    for rule, error in errors.items():
        for pasted in (error, error.partition(": ")[2].split(" (/")[0]):
            proc = explain(pasted, tmp_path)
            assert proc.returncode == 0, (pasted, proc.stderr)
            assert proc.stdout.lstrip().startswith(rule), (pasted, proc.stdout[:200])
            headers = re.findall(r"JM\d{3} [a-z-]+ \((?:un)?safe\)", proc.stdout)
            assert len(headers) == 1, (pasted, headers)  # this rule, and only it


# A skip code, as a site's message writes it -----------------------------------------------------
@pytest.mark.parametrize("query", ["PL301", "[PL301]", " pl301 "])
def test_a_skip_code_explains_that_skip_not_the_whole_rule(query: str, tmp_path: Path) -> None:
    proc = explain(query, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.lstrip().startswith("PL301: a form JM202 pmap does not take"), out[:200]
    assert "an argument's layout comes from outside the function" in out
    assert "pmap-replicated" in out, "the way out it offers"
    assert "jaxmigrate explain JM202" in out
    assert "Before" not in out and len(out) < len(explain("JM202", tmp_path).stdout) / 4


def test_every_decline_code_has_an_entry_to_explain() -> None:
    from codemods.pmap._declines import Decline
    from jaxmigrate.registry import find_skip

    for decline in Decline:
        found = find_skip(decline.value)
        assert found is not None, decline
        rule, code, entry = found
        assert (rule.CODE, code) == ("JM202", decline.value)
        assert f"`{decline.value}`" in entry and len(entry) > 40, entry
    assert find_skip("JM202") is None, "a rule's own code is the rule"
    assert find_skip("PL999") is None
