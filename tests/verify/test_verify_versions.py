"""Which JAX each side ran, and the settings that choose it (no JAX runs here).

The cross-version runs themselves are in `test_verify_reference_jax.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from clitools import jm

from jaxmigrate.cli.common import Settings, resolve_settings
from jaxmigrate.model import Options, Status
from jaxmigrate.pipeline.cache import settings_digest
from jaxmigrate.verify.config import Verdict, VerifyConfig
from jaxmigrate.verify.judge import last_with, removed_api, with_jax
from jaxmigrate.verify.reference import (
    ReferenceError,
    cache_home,
    reference_dir,
    requirements,
    resolve_reference,
)

AGREES = Verdict(Status.VERIFIED, "agrees with the original when `main()` runs", {"calls": 1})


@pytest.mark.parametrize(
    ("error", "api", "release"),
    [
        (
            "AttributeError: jax.device_put_replicated is deprecated; use jax.device_put instead.",
            "jax.device_put_replicated",
            "0.4.30",
        ),
        (
            "ModuleNotFoundError: No module named 'jax.experimental.host_callback' (at m.py:3)",
            "jax.experimental.host_callback",
            "0.4.30",
        ),
        (
            "TypeError: pjit() got an unexpected keyword argument 'in_axis_resources'",
            "pjit(..., in_axis_resources=...)",
            "0.4.13",
        ),
        # gone before any release we checked: no release is suggested
        (
            "ImportError: cannot import name 'PartitionSpec' from 'jax.experimental' (/x.py)",
            "jax.experimental.PartitionSpec",
            "",
        ),
        (
            "ModuleNotFoundError: No module named 'jax.experimental.maps'",
            "jax.experimental.maps",
            "",
        ),
        ("ValueError: shapes differ", "", ""),
    ],
)
def test_a_removed_api_is_named(error: str, api: str, release: str) -> None:
    assert removed_api([error]) == api
    assert last_with(api) == release


def test_the_verdict_names_the_removed_api_and_the_flag() -> None:
    original = [
        (
            "original: AttributeError: jax.device_put_replicated is deprecated; use "
            "jax.device_put instead. (at m.py:8)"
        ),
        "vmap-oracle: AttributeError: module 'jax' has no attribute 'vmap_thing'",
    ]
    verdict = with_jax(AGREES, original, {"original": "0.10.2", "candidate": "0.10.2"}, False)
    assert verdict.status is Status.VERIFIED
    assert verdict.reason == (
        "agrees with the original when `main()` runs; the original itself cannot run on JAX "
        "0.10.2: `jax.device_put_replicated` is gone from it; pass --reference-jax 0.4.30 (or "
        "the JAX it was written for) to verify against the original on its own JAX"
    )
    assert verdict.details["jax"] == {"original": "0.10.2", "candidate": "0.10.2"}
    assert verdict.details["removed_api"] == "jax.device_put_replicated"
    # with a reference interpreter, the flag is not suggested again
    given = with_jax(AGREES, original, {"original": "0.4.30", "candidate": "0.10.2"}, True)
    assert "removed_api" not in given.details
    assert given.reason == (
        "agrees with the original when `main()` runs "
        "(the original on JAX 0.4.30, the rewrite on JAX 0.10.2)"
    )


def test_an_original_that_ran_gets_only_the_versions() -> None:
    verdict = with_jax(AGREES, [], {"original": "0.12.0.1", "candidate": "0.12.0.1"}, False)
    assert verdict.reason == AGREES.reason  # the same JAX on both sides: nothing to add
    assert verdict.details == {"calls": 1, "jax": {"original": "0.12.0.1", "candidate": "0.12.0.1"}}


def test_requirements_pin_what_old_jax_needs() -> None:
    assert requirements("0.4.30") == ["jax==0.4.30", "jaxlib==0.4.30"]
    assert requirements("0.4.13") == ["jax==0.4.13", "jaxlib==0.4.13", "numpy<2", "ml_dtypes<0.3"]
    with pytest.raises(ReferenceError, match="expects a release like 0.4.30"):
        requirements("latest")


def test_the_cache_folder_is_keyed_by_python_and_jax(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAXMIGRATE_CACHE_DIR", str(tmp_path))
    assert cache_home() == tmp_path
    version = ".".join(map(str, sys.version_info[:3]))
    assert reference_dir("0.4.30", sys.executable) == tmp_path / "reference" / (
        f"py{version}-jax0.4.30"
    )


def test_a_reference_python_must_exist_and_have_the_jax_asked_for(tmp_path: Path) -> None:
    with pytest.raises(ReferenceError, match="no such interpreter"):
        resolve_reference(None, str(tmp_path / "nope"), sys.executable)
    with pytest.raises(ReferenceError, match="not the --reference-jax 0.4.30"):
        resolve_reference("0.4.30", sys.executable, sys.executable)
    assert resolve_reference(None, sys.executable, sys.executable) == sys.executable
    other = "/root/.pyenv/versions/3.10.13/bin/python"
    if Path(other).exists():
        with pytest.raises(ReferenceError, match="both sides must be the same Python X.Y"):
            resolve_reference(None, other, sys.executable)
    assert resolve_reference(None, None, sys.executable) is None


def test_the_settings_read_both_keys_and_flags_win(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.jaxmigrate]\nreference-jax = "0.4.30"\nreference-python = "/opt/old/python"\n'
    )
    settings = resolve_settings(
        [tmp_path],
        select=None,
        ignore=None,
        exclude=None,
        jobs=None,
        target_jax=None,
        unsafe_fixes=None,
        no_verify=True,
    )
    assert (settings.reference_jax, settings.reference_python) == ("0.4.30", "/opt/old/python")
    settings = resolve_settings(
        [tmp_path],
        select=None,
        ignore=None,
        exclude=None,
        jobs=None,
        target_jax=None,
        unsafe_fixes=None,
        no_verify=True,
        reference_jax="0.4.13",
        reference_python="/usr/bin/python3",
    )
    assert (settings.reference_jax, settings.reference_python) == ("0.4.13", "/usr/bin/python3")


def test_the_result_cache_keys_on_both_sides_interpreters(tmp_path: Path) -> None:
    plain = Settings((tmp_path,), Options(), (), 1, True, root=tmp_path)
    old = Settings((tmp_path,), Options(), (), 1, True, root=tmp_path, reference_jax="0.4.30")
    assert settings_digest(plain.options, plain.runtime()) != settings_digest(
        old.options, old.runtime()
    )
    assert plain.open_cache() != old.open_cache()


def test_a_bad_reference_release_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import jax\n")
    proc = jm("run", "--dry-run", "--reference-jax", "newest", "m.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--reference-jax expects a release like 0.4.30, got 'newest'" in proc.stderr


def test_the_verify_config_gives_each_side_its_interpreter(tmp_path: Path) -> None:
    config = VerifyConfig(root=tmp_path, python="/new/python", reference_python="/old/python")
    assert config.python_of("original") == "/old/python"
    assert config.python_of("candidate") == "/new/python"
    assert VerifyConfig(root=tmp_path, python="/new/python").python_of("original") == "/new/python"
