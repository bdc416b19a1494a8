"""Reports: JSON (validated against docs/report.schema.json), SARIF 2.1.0 (validated against the
official schema, vendored in tests/data), markdown and text; where each goes."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from clitools import jm
from test_cli import LEGACY

from jaxmigrate.model import Bucket, FileResult, Safety, Site, Skip, Status
from jaxmigrate.registry import all_passes
from jaxmigrate.report.json import json_report
from jaxmigrate.report.markdown import markdown_report
from jaxmigrate.report.sarif import sarif_report

ROOT = Path(__file__).resolve().parent.parent
REPORT_SCHEMA = json.loads((ROOT / "docs" / "report.schema.json").read_text())
SARIF_SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
NOTEBOOK = ROOT / "tests" / "fixtures_notebooks" / "jupyterlab.ipynb"
PMAP = "import jax\n\nstep = jax.pmap(lambda x: x * 2)\n"
SUPPRESSED = "from jax.experimental.maps import Mesh  # jaxmigrate: skip\n"


def validate_report(document: dict) -> None:
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(document)


def validate_sarif(document: dict) -> None:
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(document)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "legacy.py").write_text(LEGACY)
    (tmp_path / "pkg" / "step.py").write_text(PMAP)
    (tmp_path / "pkg" / "kept.py").write_text(SUPPRESSED)
    (tmp_path / "pkg" / "broken.py").write_text("from jax.experimental.maps import Mesh\ndef f(:\n")
    (tmp_path / "pkg" / "clean.py").write_text("import jax\n")
    shutil.copy(NOTEBOOK, tmp_path / "nb.ipynb")
    return tmp_path


def verified_and_failed() -> list[FileResult]:
    """Results shaped as verification leaves them, with the evidence it records."""
    base = Site("JM202", "pmap", 3, 8, Safety.UNSAFE, "`jax.pmap` -> `jax.jit` ...", "JM202:3:8")
    evidence = {
        "verification": "agrees with the original on 1 synthesized call(s)",
        "target": "pkg/step.py::main",
        "input_source": "synthesized",
        "reference": "original",
        "calls": 1,
        "input_shapes": [],
        "output_shapes": ["[0]: float32[8]"],
        "contexts": [],
        "max_abs_err": 0.0,
        "max_rel_err": 0.0,
    }
    mismatch = {"path": "[0]", "why": "values differ", "max_abs_err": 2.0}
    verified = replace(base, status=Status.VERIFIED, applied=True, details=evidence)
    failed = replace(
        base,
        key="JM202:9:8",
        line=9,
        status=Status.FAILED,
        reason="failed verification",
        details={**evidence, "verification": "outputs differ at [0]", "mismatch": mismatch},
    )
    skip = Skip("JM201", "with-mesh", 12, 5, "mesh is not a Mesh here")
    return [
        FileResult("pkg/step.py", Bucket.CHANGED, sites=(verified, failed), skips=(skip,)),
        FileResult("pkg/broken.py", Bucket.FAILED, reason="cannot parse: line 2, column 7"),
    ]


def test_json_report_follows_its_schema(project: Path) -> None:
    proc = jm("check", "--format", "json", ".", cwd=project)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)  # stdout holds the report alone
    validate_report(report)
    files = {f["path"]: f for f in report["files"]}
    assert files["pkg/broken.py"]["bucket"] == "failed"
    assert files["pkg/kept.py"]["skips"][0]["suppressed"] is True
    assert {s["cell"] for s in files["nb.ipynb"]["sites"]} == {2, 4, 6}
    assert "JM101" in proc.stderr  # the usual output went to standard error
    validate_report(json_report(verified_and_failed(), dry_run=False))


def test_schema_rejects_what_it_should() -> None:
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)
    good = json_report(verified_and_failed(), dry_run=False)
    for broken in (
        {**good, "schema_version": 2},
        {**good, "files": [{**good["files"][0], "bucket": "rewritten"}]},
        {**good, "files": [{**good["files"][0], "sites": [{"code": "JM202"}]}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_report(broken)


def test_sarif_is_valid_2_1_0(project: Path) -> None:
    proc = jm("check", "--report", "out.sarif", ".", cwd=project)  # format from the extension
    assert proc.returncode == 1
    log = json.loads((project / "out.sarif").read_text())
    validate_sarif(log)
    run = log["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert set(rules) == {p.CODE for p in all_passes()}
    pmap = next(p for p in all_passes() if p.CODE == "JM202")
    assert rules["JM202"]["shortDescription"]["text"] == pmap.summary()
    assert rules["JM202"]["help"]["text"].startswith(pmap.summary())
    by_file: dict[str, list[dict]] = {}
    for result in run["results"]:
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        by_file.setdefault(uri, []).append(result)
    (legacy,) = by_file["pkg/legacy.py"]
    assert legacy["level"] == "note" and legacy["properties"]["applied"] is True
    region = legacy["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (1, 35)
    (step,) = by_file["pkg/step.py"]
    assert step["level"] == "warning" and step["properties"]["status"] == "unverified"
    (kept,) = by_file["pkg/kept.py"]
    assert kept["suppressions"][0]["kind"] == "inSource"
    cells = [r for r in by_file["nb.ipynb"] if "cell" in r["properties"]]
    assert cells and all("region" not in r["locations"][0]["physicalLocation"] for r in cells)
    assert any(r["message"]["text"].startswith("cell 4, line 8: ") for r in cells)
    (failure,) = run["invocations"][0]["toolExecutionNotifications"]
    assert "cannot parse" in failure["message"]["text"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/")


def test_sarif_levels_follow_verification() -> None:
    log = sarif_report(verified_and_failed(), all_passes(), root=Path.cwd(), dry_run=False)
    validate_sarif(log)
    levels = [(r["ruleId"], r["level"]) for r in log["runs"][0]["results"]]
    assert levels == [("JM202", "note"), ("JM202", "error"), ("JM201", "warning")]
    failed = log["runs"][0]["results"][1]
    assert "outputs differ" in failed["message"]["text"]
    elsewhere = sarif_report(verified_and_failed(), all_passes(), root=ROOT / "docs", dry_run=False)
    validate_sarif(elsewhere)
    where = elsewhere["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert where["artifactLocation"]["uri"].startswith("file:///")  # outside the project root
    assert "uriBaseId" not in where["artifactLocation"]


def test_markdown_summary(project: Path) -> None:
    proc = jm("check", "--format", "markdown", "--report", "summary.md", ".", cwd=project)
    assert proc.returncode == 1
    text = (project / "summary.md").read_text()
    assert text.startswith("## jaxmigrate: ")
    assert "| would change | 2 |" in text and "| failed | 1 |" in text
    assert "| rule | found | would apply | unverified | not-needed | left alone |" in text
    assert "| JM202 `pmap` | 2 | 0 | 1 | 0 | 1 |" in text  # found: 1 site, 1 left alone
    assert "### Not applied (3)" in text
    assert "- `pkg/step.py:3` JM202 **unverified**: unsafe and not verified; to apply:" in text
    assert "- `nb.ipynb[cell 4]:7` JM201" in text
    assert "### Failed files (1)" in text and "- `pkg/broken.py`: cannot parse" in text
    short = markdown_report(verified_and_failed(), dry_run=False)
    assert "| JM202 `pmap` | 2 | 1 | 1 | 1 | 0 |" in short and "to apply" not in short


def test_text_report_is_plain(project: Path) -> None:
    proc = jm("run", "--dry-run", "--no-verify", "--report", "out.txt", ".", cwd=project)
    text = (project / "out.txt").read_text()
    assert "\x1b[" not in text
    assert "pkg/legacy.py:1:35 JM101 legacy-imports" in text and "Sites by rule" in text
    assert "--- a/nb.ipynb[cell 2]" in text  # a dry run's report has its diffs
    assert text.splitlines()[0] in proc.stdout


def test_report_to_stdout_keeps_stdout_clean(project: Path) -> None:
    proc = jm("check", "--format", "sarif", ".", cwd=project)
    validate_sarif(json.loads(proc.stdout))
    assert "Sites by rule" in proc.stderr
    plain = jm("check", "--format", "text", "--report", "-", ".", cwd=project)
    assert "Sites by rule" in plain.stdout and plain.stdout.count("Sites by rule") == 1


def test_unknown_format_is_a_usage_error(project: Path) -> None:
    proc = jm("check", "--format", "xml", ".", cwd=project)
    assert proc.returncode == 2 and "unknown report format 'xml'" in proc.stderr
    assert "sarif" in proc.stderr
