"""The interactive review drawn with rich: one prompt per site, its verdict and its own diff."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from jaxmigrate.model import Bucket, FileResult, Options, Safety, Site, Status, place
from jaxmigrate.pipeline.runner import OneByOne, dirty_files, with_project_files
from jaxmigrate.registry import find_pass, rule_doc, skip_doc
from jaxmigrate.review.session import KEYS, Progress, Prompt, Review, interrupts_enabled, stdin_keys
from jaxmigrate.ui.diff import file_diff
from jaxmigrate.ui.summary import STATUS_STYLE

CONTEXT = 3
WORDS = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass
class RichPresenter:
    """Draws the review on a rich console (a terminal, or plain text when piped)."""

    console: Console
    verification_ran: bool = True
    dry_run: bool = False
    _path: str = field(default="", init=False)

    def resuming(self, remembered: int, left: int) -> None:
        """Say that a previous session is resumed, with how many answers it left."""
        self.console.print(
            f"resuming: {remembered} decision(s) remembered, {left} left to review", style="bold"
        )

    def forgotten(self, stale: Sequence[str]) -> None:
        """Name the files whose remembered answers no longer count (they changed since)."""
        self.console.print(
            f"forgot the answers for {len(stale)} file(s) changed since: {', '.join(stale)}",
            style="yellow",
        )

    def show(self, prompt: Prompt) -> None:
        """Print the site: where, which rule and why, its verification, and its diff."""
        unit = prompt.unit
        if unit.path != self._path:
            self._path = unit.path
            self.console.rule(Text(unit.path, style="bold"), align="left")
        self.console.print(Text(f"[{prompt.index}/{prompt.total}] ", style="dim"), end="")
        for number, site in enumerate(unit.sites):
            if number:
                self.console.print("  and ", end="")
            self.console.print(site_header(unit.path, site))
            self.console.print(Text("    ") + self.verdict(site))
        if len(unit.sites) > 1:
            self.console.print(
                f"  group of {len(unit.sites)} sites, all or nothing: "
                "y applies every one of them, n skips every one",
                style="magenta",
            )
        if not unit.applicable:
            self.console.print(
                "  cannot be applied: failed sites are never written (y is not offered)",
                style="bold red",
            )
        lines = site_diff(prompt.before, prompt.after, unit.path)
        self.console.print(diff_text(lines), end="", soft_wrap=True)

    def verdict(self, site: Site) -> Text:
        """Return the verification line of a site: status, evidence or reason, max error."""
        style = STATUS_STYLE[site.status]
        evidence = str(site.details.get("verification", ""))
        if site.status is Status.NOT_NEEDED:
            evidence = "a safe rewrite (keeps behaviour by construction)"
        elif site.status is Status.UNVERIFIED and not evidence:
            evidence = "not run (--no-verify)" if not self.verification_ran else "no verdict"
        text = Text.assemble((str(site.status), style), f": {evidence}" if evidence else "")
        errors = [
            f"{label} {site.details[key]:.3g}"
            for key, label in (("max_abs_err", "max abs err"), ("max_rel_err", "max rel err"))
            if isinstance(site.details.get(key), int | float)
        ]
        if errors:
            text.append(f" ({', '.join(errors)})")
        return text

    def ask(self, prompt: Prompt) -> None:
        """Print the question, leaving the cursor after it."""
        unit = prompt.unit
        what = "this site" if len(unit.sites) == 1 else f"these {len(unit.sites)} sites"
        choices = ",".join(unit.choices)
        self.console.print(
            Text.assemble(
                (f"Apply {what}? ", "bold"), f"[{choices}] ", (f"(Enter = {unit.default}) ", "dim")
            ),
            end="",
        )

    def answered(self, key: str, prompt: Prompt) -> None:
        """Echo the answer (keys are read without echo on a terminal, and silently from a pipe)."""
        self.console.print(key, highlight=False)

    def explain(self, codes: Sequence[str]) -> None:
        """Print the documentation of the rules, then of the skip codes (`PL301`), as
        `jaxmigrate explain` does: the entry of this site's skip last, nearest the prompt."""
        from rich.markdown import Markdown

        skips = [doc for code in codes if (doc := skip_doc(code)) is not None]
        for code in codes:
            if skip_doc(code) is None:
                self.console.print(Markdown(rule_doc(find_pass(code))))
        for doc in skips:
            self.console.print(Markdown(doc))

    def help(self, prompt: Prompt, unknown: str | None) -> None:
        """Print what every key does (after an unknown key, say so first)."""
        if unknown is not None:
            self.console.print(f"unknown key {unknown!r}", style="yellow")
        unit = prompt.unit
        for key, what in KEYS:
            if key in unit.choices:
                self.console.print(Text.assemble(("  " + key, "bold cyan"), f"  {what}"))
        self.console.print(f"  Enter  the default, {unit.default}: " + default_reason(unit.sites))
        if not unit.applicable:
            self.console.print("  (y is not offered: this site failed verification)")

    def refuse(self, prompt: Prompt) -> None:
        """Say why a failed site cannot be applied."""
        reasons = "; ".join(
            str(s.details.get("verification") or "failed verification") for s in prompt.unit.failed
        )
        self.console.print(
            f"cannot apply: it failed verification ({reasons}); failed sites are never "
            "written: fix it by hand, or answer n",
            style="bold red",
        )

    def note(self, text: str) -> None:
        """Print a line about the review itself."""
        self.console.print(text, style="yellow")

    def file_done(self, result: FileResult) -> None:
        """Say what became of a reviewed file."""
        applied = sum(s.applied for s in result.sites)
        counts = f"{applied} of {len(result.sites)} site(s) applied" + "".join(
            f"; it imports {file.path} (jaxmigrate's module, written first)"
            for file in result.files
        )
        if result.bucket is Bucket.FAILED:
            self.console.print(f"{result.path}: not written: {result.reason}", style="bold red")
        elif result.written:
            self.console.print(f"wrote {result.path}: {counts}", style="green")
        elif result.bucket is Bucket.CHANGED and self.dry_run:
            self.console.print(f"would write {result.path}: {counts}", style="green")
        else:
            self.console.print(f"{result.path}: unchanged (no site accepted)", style="dim")


def default_reason(sites: Sequence[Site]) -> str:
    """Return why Enter means what it means for these sites."""
    if any(s.status is Status.FAILED for s in sites):
        return "a failed site is never applied"
    if all(s.safety is Safety.SAFE or s.status is Status.VERIFIED for s in sites):
        return "safe or verified rewrites are applied by default, as `jaxmigrate run` does"
    return "unsafe rewrites that were not verified are skipped unless you say y"


def site_header(path: str, site: Site) -> Text:
    """Return `path:line:col CODE name [safety]` and the site's one-line reason."""
    return Text.assemble(
        (f"{place(path, site.cell)}:{site.line}:{site.col}", "bold"),
        (f" {site.code}", "magenta"),
        (f" {site.name}", "cyan"),
        f" [{site.safety}] ",
        site.message,
    )


def site_diff(before: str, after: str, path: str) -> list[str]:
    """Return the unified diff (a few lines of context) that accepting the site makes.

    A notebook's diff is of the cells it changes (`a/nb.ipynb[cell 3]`), not of its JSON.
    """
    return file_diff(before, after, path, CONTEXT)


def diff_text(lines: Sequence[str]) -> Text:
    """Return diff lines in colour: context as Python, changed lines with the changes in bold."""
    from rich.syntax import Syntax  # pygments: loaded only when a diff is shown

    out = Text()
    python = Syntax("", "python", theme="ansi_dark")
    block: list[str] = []

    def flush() -> None:
        out.append_text(_changed_block(block))
        block.clear()

    for line in lines:
        body = line if line.endswith("\n") else line + "\n"
        if line.startswith(("+++", "---")):
            flush()
            out.append(body, style="bold")
        elif line.startswith("@@"):
            flush()
            out.append(body, style="cyan")
        elif line.startswith(("+", "-")):
            block.append(body)
        else:
            flush()
            start = len(out)
            out.append(" ")
            out.append_text(python.highlight(body[1:]))
            out.stylize("dim", start)
    flush()
    return out


def _changed_block(block: Sequence[str]) -> Text:
    """Colour a run of removed and added lines, the changed words of paired lines in bold."""
    removed = [line[1:] for line in block if line.startswith("-")]
    added = [line[1:] for line in block if line.startswith("+")]
    paired = len(removed) == len(added)
    out = Text()
    for sign, lines, others, style in (
        ("-", removed, added, "red"),
        ("+", added, removed, "green"),
    ):
        for number, line in enumerate(lines):
            text = Text(sign, style=style)
            if not paired:
                text.append(line, style=style)
            else:
                mine, theirs = WORDS.findall(line), WORDS.findall(others[number])
                matcher = difflib.SequenceMatcher(None, theirs, mine, autojunk=False)
                for tag, _, _, j1, j2 in matcher.get_opcodes():
                    emphasis = "" if tag == "equal" else " bold underline"
                    text.append("".join(mine[j1:j2]), style=style + emphasis)
            out.append_text(text)
    return out


def review_interactively(
    results: Sequence[FileResult],
    console: Console,
    *,
    options: Options,
    root: Path,
    dry_run: bool,
    allow_dirty: bool,
    verification_ran: bool,
) -> list[FileResult]:
    """Review every site on the terminal (or piped answers), then write the accepted ones.

    Ctrl-C writes nothing more (the current file is left as it was), keeps the answers for a
    resumed review and exits 130.
    """
    progress = Progress.load(root)
    presenter = RichPresenter(console, verification_ran=verification_ran, dry_run=dry_run)
    if progress.problem:
        presenter.note(progress.problem)
    writer = OneByOne()  # each file after the modules it imports: Ctrl-C leaves no dangling import
    review = Review(
        results,
        options,
        presenter,
        stdin_keys(),
        root,
        progress=progress,
        write=None if dry_run else writer,
        dirty=None if dry_run or allow_dirty else dirty_files,
    )
    try:
        with interrupts_enabled():
            results = review.run()
        if dry_run:  # the project files the accepted sites would bring, shown as new files
            return with_project_files(results)
        return [*writer.modules.values(), *results]
    except KeyboardInterrupt:
        kept = sum(len(entry["decisions"]) for entry in progress.files.values())
        Console(stderr=True, highlight=False).print(
            "\ninterrupted: files already written are complete, the current file was not "
            + (
                f"written; {kept} answer(s) kept: run again with --interactive to resume"
                if not dry_run
                else "written (dry run: answers are not kept)"
            )
        )
        raise SystemExit(130) from None
