"""Plug verification into a run: from the engine's file results to verified, re-decided ones.

`verify_results` is what `jaxmigrate run` calls between migrating and writing: it verifies the
unsafe sites of every changed file against the file with all its sites rewritten, records each
site's status and evidence, applies the default policy again (a failed site is never applied;
an unsafe one only when verified, or with `--unsafe-fixes`), and re-renders each file from the
sites that remain applied. A form with a fallback that failed (a program-level pmap step) is
migrated again in its fallback form (the faithful one) and verified again first (`fall_back`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from jaxmigrate.model import Bucket, FileResult, Options, ProjectFile, Safety, Site, Status
from jaxmigrate.pipeline.engine import (
    PassList,
    decide,
    initial_status,
    migrate_source,
    safe_alone,
)
from jaxmigrate.pipeline.notebook import migrate_notebook
from jaxmigrate.pipeline.project import VERIFYING, Project, verifying
from jaxmigrate.registry import chosen_passes
from jaxmigrate.verify import lifetime
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.notebooks import cannot_run, redecide_notebook, request_for_notebook
from jaxmigrate.verify.session import Key, verify


def verify_each(requests: Sequence[VerifyRequest], config: VerifyConfig) -> dict[Key, Verdict]:
    """Return `verify`'s verdicts; a verifier bug stops one file, never the batch.

    When verifying the batch raises, each file is verified alone, and a file that still raises
    leaves its unsafe sites `unverified`, naming the error.
    """
    try:
        return verify(requests, config)
    except Exception as exc:  # one file's bug is that file's result
        if lifetime.stopping():  # a signal is ending the run: no verdict, no retry
            raise
        if len(requests) > 1:
            return {k: v for r in requests for k, v in verify_each([r], config).items()}
        why = (
            f"verification failed inside jaxmigrate ({type(exc).__name__}: {exc}); please report it"
        )
        return {
            (r.path, s.key): Verdict(Status.UNVERIFIED, why, {"internal_error": True})
            for r in requests
            for s in r.sites
            if s.safety is Safety.UNSAFE
        }


def annotate(path: str, sites: Sequence[Site], verdicts: Mapping[Key, Verdict]) -> tuple[Site, ...]:
    """Return `sites` with the status and evidence of their verdicts (others unchanged)."""
    out = []
    for site in sites:
        verdict = verdicts.get((path, site.key))
        if verdict is not None:
            details = {**site.details, "verification": verdict.reason, **verdict.details}
            site = replace(site, status=verdict.status, details=details)
        out.append(site)
    return tuple(out)


def render(
    old_text: str,
    path: str,
    options: Options,
    keys: frozenset[str] | None,
    passes: PassList,
    fallbacks: Mapping[str, str] | None = None,
) -> str:
    """Return `old_text` with the sites in `keys` rewritten (None: all of them), the forms in
    `fallbacks` in their fallback form."""
    return migrated(old_text, path, options, keys, passes, fallbacks)[0]


def rendered(
    old_text: str,
    path: str,
    options: Options,
    keys: frozenset[str] | None,
    passes: PassList,
    fallbacks: Mapping[str, str] | None = None,
) -> tuple[str, tuple[ProjectFile, ...]]:
    """Return `render`'s text and the project files it imports."""
    code, files, _ = migrated(old_text, path, options, keys, passes, fallbacks)
    return code, files


def migrated(
    old_text: str,
    path: str,
    options: Options,
    keys: frozenset[str] | None,
    passes: PassList,
    fallbacks: Mapping[str, str] | None = None,
) -> tuple[str, tuple[ProjectFile, ...], tuple[Site, ...]]:
    """Return `rendered`'s text and files, and the sites the passes recorded (not decided).

    The engine's own entry, so what is verified and written is what the first run showed: the
    same reading of the code base (its style, who calls the module, the modules it imports)."""
    recorded: list[Site] = []

    def accept(sites: Sequence[Site]) -> list[Site]:
        recorded.extend(sites)
        return [replace(s, applied=keys is None or s.key in keys) for s in sites]

    project = verifying()
    migration = migrate_source(
        old_text,
        options=options,
        passes=passes,
        accept=accept,
        path=path,
        home=lambda: project.home(Path(path), old_text),
        project=project,
        fallbacks=fallbacks,
    )
    return migration.code, migration.files, tuple(initial_status(s) for s in recorded)


def request_for(
    result: FileResult, relpath: str, options: Options, passes: PassList
) -> VerifyRequest:
    """Return the verification request of one migrated file (in the fallback forms chosen for
    it, `result.fallbacks`: its sites are those of that rendering)."""
    old = result.old_text or ""
    safe = safe_alone(result.sites)
    fallbacks = result.fallbacks
    candidate, files = rendered(old, result.path, options, None, passes, fallbacks)
    base = Path(result.path).parent
    return VerifyRequest(
        path=relpath,
        original=old,
        candidate=candidate,
        files={
            os.path.normpath(Path(relpath).parent / os.path.relpath(f.path, base)): f.text
            for f in files
        },
        sites=result.sites,
        rewrite=lambda keys: render(old, result.path, options, keys, passes, fallbacks),
        baseline=render(old, result.path, options, safe, passes, fallbacks) if safe else None,
    )


def needs_verifying(result: FileResult) -> bool:
    """Return whether a file has unsafe sites (a notebook's are verified by running its cells)."""
    if result.old_text is None:
        return False
    return any(s.safety is Safety.UNSAFE for s in result.sites)


def relative(path: str, root: Path) -> str | None:
    """Return `path` relative to the project root, or None if it lies outside."""
    try:
        rel = os.path.relpath(Path(path).resolve(), root.resolve())
    except (OSError, RuntimeError):  # a symlink loop (Python 3.11 raises RuntimeError)
        return None
    return None if rel.startswith("..") else rel


def redecide(
    result: FileResult, sites: tuple[Site, ...], options: Options, passes: PassList
) -> FileResult:
    """Return the result with `sites` decided by the policy and the text re-rendered to match."""
    decided = decide(sites, options.unsafe_fixes)
    applied = frozenset(s.key for s in decided if s.applied)
    old = result.old_text or ""
    new, files = (
        rendered(old, result.path, options, applied, passes, result.fallbacks)
        if applied
        else (old, ())
    )
    bucket = Bucket.CHANGED if new != old else Bucket.UNCHANGED
    return replace(result, sites=decided, new_text=new, bucket=bucket, files=files)


def verify_results(
    results: Sequence[FileResult],
    options: Options,
    config: VerifyConfig,
    passes: PassList | None = None,
) -> list[FileResult]:
    """Verify the unsafe sites of `results` and return them re-decided and re-rendered.

    `passes` are those that produced the results (default: the options' selection).
    """
    token = VERIFYING.set(Project())
    try:
        return _verify_results(results, options, config, passes)
    finally:
        VERIFYING.reset(token)


def _verify_results(
    results: Sequence[FileResult],
    options: Options,
    config: VerifyConfig,
    passes: PassList | None,
) -> list[FileResult]:
    chosen = chosen_passes(options) if passes is None else passes
    wanted = {}
    outside = set()
    cannot: dict[str, str] = {}  # notebooks that cannot run here, and why
    for result in results:
        rel = relative(result.path, config.root) if needs_verifying(result) else None
        if needs_verifying(result) and rel is not None and result.path.endswith(".ipynb"):
            made = request_for_notebook(result, rel, options)
            if isinstance(made, str):
                cannot[result.path] = made
            else:
                wanted[result.path] = (made.path, made)
        elif needs_verifying(result) and rel is not None:
            wanted[result.path] = (rel, request_for(result, rel, options, chosen))
        elif needs_verifying(result):
            outside.add(result.path)
    verdicts = verify_each([request for _, request in wanted.values()], config)
    annotated = {
        r.path: annotate(wanted[r.path][0], r.sites, verdicts) for r in results if r.path in wanted
    }
    again = fall_back(results, annotated, wanted, options, config, chosen)
    out = []
    for result in results:
        if result.path in again and result.path.endswith(".ipynb"):
            result = settled(redecide_notebook(*again[result.path], options))
        elif result.path in again:
            result = settled(redecide(*again[result.path], options, chosen))
        elif result.path in wanted:
            sites = annotated[result.path]
            if result.path.endswith(".ipynb"):
                result = redecide_notebook(result, sites, options)
            else:
                result = redecide(result, sites, options, chosen)
        elif result.path in cannot:
            result = replace(result, sites=cannot_run(result.sites, cannot[result.path]))
        elif result.path in outside:
            why = f"not verified: the file lies outside the project root {config.root}"
            sites = tuple(
                replace(s, details={**s.details, "verification": why})
                if s.safety is Safety.UNSAFE
                else s
                for s in result.sites
            )
            result = replace(result, sites=sites)
        out.append(result)
    return out


# How much of the program-level form's failure the faithful site's message quotes (the whole
# reason is in its details, `program_level`).
SHORT_REASON = 120


def short(reason: str) -> str:
    """Return the first line of a verification reason, cut to `SHORT_REASON` characters."""
    line = reason.strip().splitlines()[0] if reason.strip() else "no reason given"
    return line if len(line) <= SHORT_REASON else line[: SHORT_REASON - 3].rstrip() + "..."


def failed_forms(sites: Sequence[Site]) -> dict[str, str]:
    """Return the forms with a fallback whose group failed verification: key -> full reason.

    Only `failed` asks for the fallback: an `unverified` form had nothing to compare against
    (no inputs, an original that cannot run), and the faithful form, verified through the same
    target on the same inputs, could not do better.
    """
    out: dict[str, str] = {}
    for site in sites:
        if site.fallback is not None and site.group is not None and site.status is Status.FAILED:
            out.setdefault(site.fallback, str(site.details.get("verification", "")))
    return out


def fall_back(
    results: Sequence[FileResult],
    annotated: Mapping[str, tuple[Site, ...]],
    wanted: Mapping[str, tuple[str, VerifyRequest]],
    options: Options,
    config: VerifyConfig,
    passes: PassList,
) -> dict[str, tuple[FileResult, tuple[Site, ...]]]:
    """Migrate again, in their fallback form, the forms that failed verification; verify those
    files again; return each one's result (rendered that way) and its annotated sites.

    Per form, not per file: a program-level pmap step that failed becomes faithful, the other
    steps of its file keep the form they verified in. Every unsafe site of such a file is
    verified again (the text around them changed), so what is written is what was verified.
    """
    todo: dict[str, tuple[FileResult, dict[str, str]]] = {}
    for result in results:
        failed = failed_forms(annotated.get(result.path, ()))
        if failed:
            todo[result.path] = (result, failed)
    if not todo:
        return {}
    redone: dict[str, FileResult] = {}
    requests = []
    for path, (result, failed) in todo.items():
        fallbacks = {key: short(reason) for key, reason in failed.items()}
        old, (relpath, request) = result.old_text or "", wanted[path]
        if path.endswith(".ipynb"):  # its cells, as one module, in the same forms
            sites = migrate_notebook(
                old, options=options, path=path, project=verifying(), fallbacks=fallbacks
            ).sites
        else:
            sites = migrated(old, path, options, None, passes, fallbacks)[2]
        sites = tuple(_with_failure(s, failed) for s in sites)
        redone[path] = replace(result, sites=sites, fallbacks=fallbacks)
        requests.append(_request(redone[path], relpath, request, options, passes))
    verdicts = verify_each(requests, config)
    return {
        path: (result, annotate(wanted[path][0], result.sites, verdicts))
        for path, result in redone.items()
    }


def _request(
    result: FileResult, relpath: str, first: VerifyRequest, options: Options, passes: PassList
) -> VerifyRequest:
    """Return the verification request of a file migrated again in its fallback forms (`first`:
    its request in the forms that failed; a notebook's cells ran then, so they run now)."""
    if not result.path.endswith(".ipynb"):
        return request_for(result, relpath, options, passes)
    made = request_for_notebook(result, first.label, options)
    assert not isinstance(made, str), made  # the same cells ran in the program-level form
    return made


def _with_failure(site: Site, failed: Mapping[str, str]) -> Site:
    """Return a site written in a fallback form with the form's failure in its details."""
    key = site.fallback
    if key is None or key not in failed or site.group is not None:
        return site
    program = {"status": str(Status.FAILED), "reason": failed[key]}
    return replace(site, details={**site.details, "program_level": program})


def settled(result: FileResult) -> FileResult:
    """Return `result` with the message of each site written in a fallback form ending in what
    came of it: written, or failed too (both reasons), or left unapplied."""
    sites = []
    for site in result.sites:
        if site.fallback in result.fallbacks and site.group is None:
            if site.applied:
                tail = ": faithful form written"
            elif site.status is Status.FAILED:
                why = short(str(site.details.get("verification", "")))
                tail = f"; the faithful form failed too ({why}): nothing written"
            else:
                tail = f": faithful form not written ({site.reason})"
            site = replace(site, message=site.message + tail)
        sites.append(site)
    return replace(result, sites=tuple(sites))
