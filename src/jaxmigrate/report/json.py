"""Machine-readable reports of a run: the versioned JSON document.

Its JSON Schema is docs/report.schema.json (tested against real output). Adding an optional
field keeps `SCHEMA_VERSION`; removing or retyping one raises it. The SARIF and markdown forms
are in `report_sarif` and `report_markdown`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxmigrate._version import __version__
from jaxmigrate.model import FileResult

SCHEMA_VERSION = 1


def summary(results: Sequence[FileResult]) -> dict[str, Any]:
    """Return counts of files by bucket and of sites by rule and status."""
    sites = [s for r in results for s in r.sites]
    by_rule: dict[str, dict[str, int]] = {}
    for site in sites:
        row = by_rule.setdefault(site.code, {"found": 0, "applied": 0})
        row["found"] += 1
        row["applied"] += site.applied
        row[str(site.status)] = row.get(str(site.status), 0) + 1
    return {
        "files": dict(Counter(str(r.bucket) for r in results)),
        "sites": {
            "found": len(sites),
            "applied": sum(s.applied for s in sites),
            "by_status": dict(Counter(str(s.status) for s in sites)),
            "by_rule": by_rule,
        },
        "skips": sum(len(r.skips) for r in results),
    }


def json_report(results: Sequence[FileResult], *, dry_run: bool) -> dict[str, Any]:
    """Return the JSON report document."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "jaxmigrate", "version": __version__},
        "dry_run": dry_run,
        "files": [r.to_json() for r in results],
        "summary": summary(results),
    }
