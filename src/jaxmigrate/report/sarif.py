"""The SARIF 2.1.0 report, so GitHub code scanning (and any SARIF viewer) shows sites inline.

One run; the driver lists every rule with its one-line summary as help text (the full rule
documentation as markdown help). Each site is a result whose level follows its verification
status (failed: error; unverified: warning; verified or not needed: note) and whose properties
carry safety, status, whether it was applied and why not. A construct a pass left alone is a
warning result too, since it still needs a person; one suppressed by `# jaxmigrate: skip` carries
an in-source suppression. Files that failed are tool execution notifications.

Locations are relative to the project root (`%SRCROOT%`). A notebook's sites have no region: a
line of a cell is not a line of the `.ipynb` file, so the result points at the file and its
message and properties name the cell and the line within it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxmigrate._version import __version__
from jaxmigrate.model import Bucket, FileResult, Site, Skip, Status
from jaxmigrate.toolkit.passes import Pass

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {
    Status.FAILED: "error",
    Status.UNVERIFIED: "warning",
    Status.VERIFIED: "note",
    Status.NOT_NEEDED: "note",
}


def _rule(p: type[Pass]) -> dict[str, Any]:
    doc = inspect.cleandoc(sys.modules[p.__module__].__doc__ or p.__doc__ or "")
    return {
        "id": p.CODE,
        "name": p.NAME,
        "shortDescription": {"text": p.summary()},
        "fullDescription": {"text": p.summary()},
        "help": {
            "text": f"{p.summary()} Run `jaxmigrate explain {p.CODE}` for the rule's documentation.",
            "markdown": doc or p.summary(),
        },
        "defaultConfiguration": {"level": "warning"},
        "properties": {"safety": str(p.SAFETY), "tags": ["jax", "migration", str(p.SAFETY)]},
    }


def _uri(path: str, root: Path) -> str:
    absolute = Path(path).resolve()
    try:
        return absolute.relative_to(root.resolve()).as_posix()
    except ValueError:
        return absolute.as_uri()


def _artifact(uri: str) -> dict[str, Any]:
    """A location relative to the project root, or an absolute `file:` URI outside it."""
    return {"uri": uri} if uri.startswith("file:") else {"uri": uri, "uriBaseId": "%SRCROOT%"}


def _location(uri: str, record: Site | Skip) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": _artifact(uri)}
    if record.cell is None:
        physical["region"] = {"startLine": record.line, "startColumn": record.col}
    return {"physicalLocation": physical}


def _where(record: Site | Skip) -> str:
    return "" if record.cell is None else f"cell {record.cell}, line {record.line}: "


def _site_result(site: Site, uri: str, index: int | None, dry_run: bool) -> dict[str, Any]:
    if site.applied:
        outcome = "would be applied" if dry_run else "applied"
    else:
        outcome = f"not applied: {site.reason}" if site.reason else "not applied"
    properties: dict[str, Any] = {
        "safety": str(site.safety),
        "status": str(site.status),
        "applied": site.applied,
    }
    if site.reason:
        properties["reason"] = site.reason
    if site.cell is not None:
        properties.update(cell=site.cell, cellLine=site.line, cellColumn=site.col)
    evidence = site.details.get("verification")
    text = f"{_where(site)}{site.message} [{site.safety}, {site.status}; {outcome}]"
    if evidence:
        text += f" {evidence}"
    return _with_index(
        {
            "ruleId": site.code,
            "level": LEVELS[site.status],
            "message": {"text": text},
            "locations": [_location(uri, site)],
            "properties": properties,
        },
        index,
    )


def _skip_result(skip: Skip, uri: str, index: int | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": skip.code,
        "level": "note" if skip.suppressed else "warning",
        "message": {"text": f"{_where(skip)}left alone: {skip.reason}"},
        "locations": [_location(uri, skip)],
        "properties": {"skipped": True, "suppressed": skip.suppressed},
    }
    if skip.cell is not None:
        result["properties"].update(cell=skip.cell, cellLine=skip.line, cellColumn=skip.col)
    if skip.suppressed:
        result["suppressions"] = [{"kind": "inSource", "justification": skip.reason}]
    return _with_index(result, index)


def _with_index(result: dict[str, Any], index: int | None) -> dict[str, Any]:
    """Point a result at its rule in the driver's list, when the rule is there."""
    return result if index is None else {**result, "ruleIndex": index}


def _notification(result: FileResult, uri: str) -> dict[str, Any]:
    return {
        "level": "error",
        "message": {"text": f"{result.path}: {result.reason}"},
        "locations": [{"physicalLocation": {"artifactLocation": _artifact(uri)}}],
    }


def sarif_report(
    results: Sequence[FileResult], passes: Sequence[type[Pass]], *, root: Path, dry_run: bool
) -> dict[str, Any]:
    """Return the SARIF 2.1.0 log of a run over `results` with the rules of `passes`."""
    index = {p.CODE: i for i, p in enumerate(passes)}
    findings: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for result in results:
        uri = _uri(result.path, root)
        findings += [_site_result(s, uri, index.get(s.code), dry_run) for s in result.sites]
        findings += [_skip_result(s, uri, index.get(s.code)) for s in result.skips]
        if result.bucket is Bucket.FAILED:
            failures.append(_notification(result, uri))
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "jaxmigrate",
                        "version": __version__,
                        "rules": [_rule(p) for p in passes],
                    }
                },
                "originalUriBaseIds": {
                    "%SRCROOT%": {"uri": root.resolve().as_uri().rstrip("/") + "/"}
                },
                "invocations": [
                    {"executionSuccessful": True, "toolExecutionNotifications": failures}
                ],
                "results": findings,
            }
        ],
    }
