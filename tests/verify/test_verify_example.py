"""The bundled example project through the real passes and the verifier (the issue's criterion).

With `--verify-with run_all.py` every unsafe site verifies and is applied; without any inputs the
train step, whose own inputs cannot be synthesized, is verified by running the `main()` that
uses it (its unit), on both sides.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from jaxmigrate.model import FileResult, Options, Safety, Status
from jaxmigrate.pipeline.files import process_file
from jaxmigrate.verify import VerifyConfig, verify_results

pytestmark = pytest.mark.jax
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "legacy_project"


def migrated(root: Path, verify_with: str | None) -> list[FileResult]:
    options = Options()
    results = [process_file(p, options) for p in sorted((root / "legacy_project").glob("*.py"))]
    config = VerifyConfig(root=root, verify_with=verify_with, timeout=120.0, jobs=1)
    return verify_results(results, options, config)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "legacy_project"
    shutil.copytree(EXAMPLE, root)
    return root


def unsafe(results: list[FileResult]) -> dict[tuple[str, int], object]:
    return {
        (Path(r.path).name, s.line): s
        for r in results
        for s in r.sites
        if s.safety is Safety.UNSAFE
    }


def test_recorded_inputs_verify_every_unsafe_site(project: Path) -> None:
    sites = unsafe(migrated(project, f"{sys.executable} run_all.py"))
    assert sites, "the passes found no unsafe site in the example"
    for where, site in sites.items():
        assert site.status is Status.VERIFIED, (where, site.details)
        assert site.applied, where


def test_without_inputs_the_step_is_verified_through_the_main_using_it(project: Path) -> None:
    results = migrated(project, None)
    sites = unsafe(results)
    step = sites[("train.py", 38)]  # `p_train_step = jax.pmap(...)`, program-level
    assert step.status is Status.VERIFIED and step.applied, step.details
    assert step.details["target"] == "legacy_project/train.py::main"
    train = next(r for r in results if r.path.endswith("train.py"))
    assert train.new_text is not None and "jax.pmap" not in train.new_text
