"""The markdown report: a short summary to post as a pull-request comment.

A headline, the files by bucket and the sites by rule as tables, then what needs a person: the
sites not applied (with why and what would apply them), the constructs left alone, and the files
that failed. Long lists are cut (a comment has a size limit); the JSON report has everything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from jaxmigrate.model import Bucket, FileResult, Site, Status, place

LIMIT = 50


def _cell(text: str) -> str:
    """Return `text` safe inside a markdown table cell or list item (one line, no pipes)."""
    return " ".join(text.split()).replace("|", "\\|")


def _headline(results: Sequence[FileResult], dry_run: bool) -> str:
    sites = [s for r in results for s in r.sites]
    applied = sum(s.applied for s in sites)
    verb = "would apply" if dry_run else "applied"
    changed = sum(r.bucket is Bucket.CHANGED for r in results)
    files = "would change" if dry_run else "changed"
    return (
        f"## jaxmigrate: {len(sites)} site(s) in {len(results)} file(s), {applied} {verb}, "
        f"{len(sites) - applied} not applied; {changed} file(s) {files}"
    )


def _buckets(results: Sequence[FileResult], dry_run: bool) -> list[str]:
    counts = Counter(r.bucket for r in results)
    rows = ["| files | count |", "| --- | ---: |"]
    for bucket in Bucket:
        label = "would change" if dry_run and bucket is Bucket.CHANGED else str(bucket)
        rows.append(f"| {label} | {counts.get(bucket, 0)} |")
    return rows


def _rules(results: Sequence[FileResult], dry_run: bool) -> list[str]:
    sites = [s for r in results for s in r.sites]
    skips = [s for r in results for s in r.skips]
    codes = sorted({(s.code, s.name) for s in sites} | {(s.code, s.name) for s in skips})
    if not codes:
        return []
    statuses = [st for st in Status if any(s.status is st for s in sites)]
    head = ["rule", "found", "would apply" if dry_run else "applied", *statuses, "left alone"]
    rows = ["| " + " | ".join(map(str, head)) + " |", "|" + " --- |" + " ---: |" * (len(head) - 1)]
    for code, name in codes:
        mine = [s for s in sites if s.code == code]
        left = sum(s.code == code for s in skips)
        cells = [
            f"{code} `{name}`",
            str(len(mine) + left),  # found: rewritten or left alone
            str(sum(s.applied for s in mine)),
            *(str(sum(s.status is st for s in mine)) for st in statuses),
            str(left),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _listed(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    lines = ["", f"### {title} ({len(items)})", ""]
    lines += items[:LIMIT]
    if len(items) > LIMIT:
        lines.append(f"- ... and {len(items) - LIMIT} more (see the JSON report)")
    return lines


def markdown_report(
    results: Sequence[FileResult], *, dry_run: bool, hint: Callable[[Site], str] | None = None
) -> str:
    """Return the pull-request summary of a run, in GitHub-flavoured markdown.

    `hint(site)`, when given, says what would apply a site that was not applied.
    """
    pending = [
        f"- `{place(r.path, s.cell)}:{s.line}` {s.code} **{s.status}**: {_cell(s.reason)}"
        + (f"; to apply: {_cell(hint(s))}" if hint else "")
        for r in results
        for s in r.sites
        if not s.applied
    ]
    left = [
        f"- `{place(r.path, s.cell)}:{s.line}` {s.code}"
        + (" (suppressed)" if s.suppressed else "")
        + f": {_cell(s.reason)}"
        for r in results
        for s in r.skips
    ]
    failed = [f"- `{r.path}`: {_cell(r.reason)}" for r in results if r.bucket is Bucket.FAILED]
    lines = [_headline(results, dry_run), "", *_buckets(results, dry_run)]
    rules = _rules(results, dry_run)
    if rules:
        lines += ["", *rules]
    lines += _listed("Not applied", pending)
    lines += _listed("Left alone", left)
    lines += _listed("Failed files", failed)
    return "\n".join(lines) + "\n"
