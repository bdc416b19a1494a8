"""The per-site lines and the end-of-run summary tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jaxmigrate.model import Bucket, FileResult, Safety, Site, Skip, Status, place
from jaxmigrate.review.session import NOT_REVIEWED, REJECTED

STATUS_STYLE = {
    Status.VERIFIED: "green",
    Status.FAILED: "bold red",
    Status.UNVERIFIED: "yellow",
    Status.NOT_NEEDED: "dim",
}
BUCKET_STYLE = {
    Bucket.CHANGED: "green",
    Bucket.UNCHANGED: "dim",
    Bucket.SKIPPED: "yellow",
    Bucket.FAILED: "bold red",
}


def site_line(path: str, site: Site, *, dry_run: bool = False) -> Text:
    """Return `path:line:col CODE name [safety, status] message` (and why it was not applied)."""
    text = Text()
    text.append(f"{place(path, site.cell)}:{site.line}:{site.col}", style="bold")
    text.append(f" {site.code} ", style="magenta")
    text.append(f"{site.name} ", style="cyan")
    text.append(f"[{site.safety}, ")
    text.append(str(site.status), style=STATUS_STYLE[site.status])
    text.append("] ")
    text.append(site.message)
    if site.applied:
        text.append(" (would apply)" if dry_run else " (applied)", style="green")
    elif site.reason:
        text.append(f" (not applied: {site.reason})", style="yellow")
    evidence = site.details.get("verification")
    if evidence and site.status in (Status.FAILED, Status.UNVERIFIED, Status.VERIFIED):
        text.append(f"\n    {evidence}", style=STATUS_STYLE[site.status])
    return text


def skip_line(path: str, skip: Skip) -> Text:
    """Return the line for a construct a pass left alone."""
    text = Text()
    text.append(f"{place(path, skip.cell)}:{skip.line}:{skip.col}", style="bold")
    text.append(f" {skip.code} ", style="magenta")
    text.append(f"{skip.name} ", style="cyan")
    text.append("[suppressed] " if skip.suppressed else "[skipped] ", style="dim")
    # the target's source and what sets another are said once, under the tables (`too_new`)
    text.append(too_new_reason(skip) if skip.needs_jax else skip.reason)
    return text


def too_new_reason(skip: Skip) -> str:
    """Return the short reason of a site left alone for the target JAX: without where the
    target came from, said once under the tables (`too_new`)."""
    return f"the rewrite needs JAX >= {skip.needs_jax}, the target is {skip.target_jax}"


def too_new(skips: Sequence[Skip]) -> Text | None:
    """Return the one note for the sites left alone because their rewrite needs a newer JAX
    than the run's target: the target, where it comes from, and the flag that migrates them."""
    held = [s for s in skips if s.needs_jax]
    if not held:
        return None
    need = max((s.needs_jax for s in held), key=lambda v: tuple(map(int, v.split("."))))
    first = next(s for s in held if s.needs_jax == need)
    source = first.target_source.partition("; ")[0]  # (what sets another: said below)
    text = Text(f"Left alone ({len(held)}): ", style="bold")
    text.append(too_new_reason(first) + (f" ({source})" if source else ""))
    text.append(
        f'; `--target-jax {need}` (or `target-jax = "{need}"` in [tool.jaxmigrate]) migrates'
        f" them, once the project can require jax>={need}"
    )
    return text


def file_problem_line(result: FileResult) -> Text:
    """Return the one line for a skipped or failed file."""
    style = BUCKET_STYLE[result.bucket]
    return Text.assemble(
        (result.path, "bold"), ": ", (str(result.bucket), style), f": {result.reason}"
    )


def summary_tables(results: Sequence[FileResult], *, dry_run: bool) -> list[Table | Text]:
    """Return the tables (and the list of unapplied sites) printed at the end of every run."""
    tables: list[Table | Text] = [_bucket_table(results, dry_run=dry_run)]
    sites = [s for r in results for s in r.sites]
    skips = [s for r in results for s in r.skips]
    if sites or skips:
        tables.append(_rule_table(sites, skips, dry_run=dry_run))
    held = too_new(skips)
    if held is not None:
        tables.append(held)
    missing = not_installed(sites)
    if missing is not None:
        tables.append(missing)
    pending = [(r.path, s) for r in results for s in r.sites if not s.applied]
    if pending:
        tables.append(_pending_lines(pending))
    return tables


def _bucket_table(results: Sequence[FileResult], *, dry_run: bool) -> Table:
    counts = Counter(r.bucket for r in results)
    table = Table(title="Files", title_justify="left", show_edge=False)
    table.add_column("bucket")
    table.add_column("files", justify="right")
    for bucket in Bucket:
        label = "would change" if dry_run and bucket is Bucket.CHANGED else str(bucket)
        table.add_row(Text(label, style=BUCKET_STYLE[bucket]), str(counts.get(bucket, 0)))
    return table


def _rule_table(sites: Sequence[Site], skips: Sequence[Skip], *, dry_run: bool) -> Table:
    table = Table(title="Sites by rule", title_justify="left", show_edge=False)
    for column in ("rule", "name", "found", "would apply" if dry_run else "applied"):
        table.add_column(column, justify="left" if column in ("rule", "name") else "right")
    table.add_column("verification")
    table.add_column("left alone", justify="right")
    rules = sorted({(s.code, s.name) for s in sites} | {(s.code, s.name) for s in skips})
    for code, name in rules:
        mine = [s for s in sites if s.code == code]
        by_status = Counter(s.status for s in mine)
        statuses = Text(", ").join(
            Text(f"{by_status[st]} {st}", style=STATUS_STYLE[st]) for st in Status if by_status[st]
        )
        left = sum(s.code == code for s in skips)
        table.add_row(
            code,
            name,
            str(len(mine) + left),  # found: rewritten or left alone
            str(sum(s.applied for s in mine)),
            statuses,
            str(left),
        )
    return table


def missing_module(site: Site) -> str | None:
    """Return the top-level module whose absence kept the original from running, if that is
    why the site was not verified (the worker's `missing_module`)."""
    if site.status is not Status.UNVERIFIED:
        return None
    found = site.details.get("missing_module")
    return found if isinstance(found, str) and found else None


def not_installed(sites: Sequence[Site]) -> Text | None:
    """Return the one note for the sites verification could not run because a module the
    project imports is not installed where its code runs, naming each with its count."""
    counts = Counter(m for m in map(missing_module, sites) if m is not None)
    if not counts:
        return None
    modules = ", ".join(f"`{m}` ({n})" for m, n in counts.most_common())
    text = Text(f"Not verified ({sum(counts.values())}): ", style="bold yellow")
    text.append(
        f"the original could not run, a module it imports is not installed: {modules}; install "
        "the project's requirements in the interpreter that runs its code (`--python`; by "
        "default the one jaxmigrate runs on) and run again"
    )
    return text


def apply_hint(site: Site) -> str:
    """Return the flag or action that would apply an unapplied site."""
    if site.status is Status.FAILED:
        return "fix it by hand (failed sites are never written)"
    if "group" in site.reason:
        return "apply the other sites of its group"
    if site.reason.startswith("file not written"):
        return "see the file's error above"
    if site.reason == NOT_REVIEWED:
        return "jaxmigrate run --interactive (resumes the review)"
    if site.reason == REJECTED:
        return "jaxmigrate run --interactive, and answer y"
    module = missing_module(site)
    if module is not None:
        return f"install `{module}` where the project's code runs (`--python`) and run again, or --unsafe-fixes"
    if site.cell is not None and site.details.get("unit") == "notebook":
        return "make the notebook run here (see its reason), or --unsafe-fixes after reviewing the diff"
    if site.cell is not None:
        return "run with verification (it runs the notebook's cells), or --unsafe-fixes"
    if site.details.get("verify_with"):  # the command ran: suggesting it again would not help
        return "a --verify-with command that calls it, __jaxmigrate_examples__, or --unsafe-fixes"
    return "--verify-with CMD (record real inputs) or --unsafe-fixes"


def verify_with_problem(results: Sequence[FileResult]) -> Text | None:
    """Return the warning for a `--verify-with` command that failed or timed out, if any."""
    for result in results:
        for site in result.sites:
            error = site.details.get("verify_with_error")
            if error:
                text = Text("warning: ", style="bold yellow")
                text.append(f"--verify-with {error}\n")
                text.append("  calls made before it stopped were still recorded", style="dim")
                return text
    return None


def notebooks_note(results: Sequence[FileResult]) -> Text | None:
    """Return the notice that verification will execute notebooks, if any is to be verified.

    A notebook is verified by running its code cells, so the user hears it before it happens,
    with what it implies and how to avoid it.
    """
    notebooks = [
        r.path
        for r in results
        if any(s.cell is not None and s.safety is Safety.UNSAFE for s in r.sites)
    ]
    if not notebooks:
        return None
    names = ", ".join(notebooks[:3]) + (
        f" and {len(notebooks) - 3} more" if len(notebooks) > 3 else ""
    )
    text = Text("note: ", style="bold")
    text.append(
        f"verification executes {len(notebooks)} notebook(s) ({names}): their code cells run "
        "twice, on the original and on the rewritten text, in temporary copies of the "
        "project, without network where the system allows it; what they write outside the "
        "project (files under ~) they write, and it is reported. "
        "Pass --no-verify to run nothing (unsafe notebook sites then stay unverified)."
    )
    return text


def _pending_lines(pending: Sequence[tuple[str, Site]]) -> Text:
    text = Text(f"Not applied ({len(pending)})\n", style="bold")
    for path, site in pending[:50]:
        text.append(f"  {place(path, site.cell)}:{site.line} {site.code} ")
        text.append(str(site.status), style=STATUS_STYLE[site.status])
        text.append(f": {site.reason}; to apply: {apply_hint(site)}\n")
        if site.status is Status.FAILED and site.details.get("verification"):
            text.append(f"      {site.details['verification']}\n", style=STATUS_STYLE[site.status])
    if len(pending) > 50:
        text.append(f"  ... and {len(pending) - 50} more (see the site lines above)\n")
    return text


def print_summary(console: Console, results: Sequence[FileResult], *, dry_run: bool) -> None:
    """Print the summary tables."""
    for table in summary_tables(results, dry_run=dry_run):
        console.print()
        console.print(table)
