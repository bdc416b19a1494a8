"""Plug verification into a run: from the engine's file results to verified, re-decided ones.

`verify_results` is what `jaxmigrate run` calls between migrating and writing: it verifies the
unsafe sites of every changed file against the file with all its sites rewritten, records each
site's status and evidence, applies the default policy again (a failed site is never applied;
an unsafe one only when verified, or with `--unsafe-fixes`), and re-renders each file from the
sites that remain applied.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from jaxmigrate.model import Bucket, FileResult, Options, ProjectFile, Safety, Site
from jaxmigrate.pipeline.engine import (
    PassList,
    decide,
    needed,
    parse_module,
    run_passes,
    safe_alone,
)
from jaxmigrate.pipeline.project import Project
from jaxmigrate.registry import chosen_passes
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.notebooks import cannot_run, redecide_notebook, request_for_notebook
from jaxmigrate.verify.session import Key, verify


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
    old_text: str, path: str, options: Options, keys: frozenset[str] | None, passes: PassList
) -> str:
    """Return `old_text` with the sites in `keys` rewritten (None: all of them)."""
    return rendered(old_text, path, options, keys, passes)[0]


def rendered(
    old_text: str, path: str, options: Options, keys: frozenset[str] | None, passes: PassList
) -> tuple[str, tuple[ProjectFile, ...]]:
    """Return `render`'s text and the project files it imports."""
    module = parse_module(old_text)
    new, run = run_passes(
        module,
        old_text,
        passes,
        enabled=keys,
        target_jax=options.target_jax,
        path=path,
        home=Project().home(Path(path), old_text),
        pmap_style=options.pmap_style,
    )
    applied = frozenset(s.key for s in run.sites) if keys is None else keys
    return new.code, needed(run.files, applied)


def request_for(
    result: FileResult, relpath: str, options: Options, passes: PassList
) -> VerifyRequest:
    """Return the verification request of one migrated file."""
    old = result.old_text or ""
    safe = safe_alone(result.sites)
    candidate, files = rendered(old, result.path, options, None, passes)
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
        rewrite=lambda keys: render(old, result.path, options, keys, passes),
        baseline=render(old, result.path, options, safe, passes) if safe else None,
    )


def needs_verifying(result: FileResult) -> bool:
    """Return whether a file has unsafe sites (a notebook's are verified by running its cells)."""
    if result.old_text is None:
        return False
    return any(s.safety is Safety.UNSAFE for s in result.sites)


def relative(path: str, root: Path) -> str | None:
    """Return `path` relative to the project root, or None if it lies outside."""
    rel = os.path.relpath(Path(path).resolve(), root.resolve())
    return None if rel.startswith("..") else rel


def redecide(
    result: FileResult, sites: tuple[Site, ...], options: Options, passes: PassList
) -> FileResult:
    """Return the result with `sites` decided by the policy and the text re-rendered to match."""
    decided = decide(sites, options.unsafe_fixes)
    applied = frozenset(s.key for s in decided if s.applied)
    old = result.old_text or ""
    new, files = rendered(old, result.path, options, applied, passes) if applied else (old, ())
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
    chosen = chosen_passes(options) if passes is None else passes
    wanted = {}
    outside = set()
    cannot: dict[str, str] = {}  # notebooks that cannot run here, and why
    for result in results:
        rel = relative(result.path, config.root)
        if needs_verifying(result) and rel is not None and result.path.endswith(".ipynb"):
            made = request_for_notebook(result, rel, options, config.python)
            if isinstance(made, str):
                cannot[result.path] = made
            else:
                wanted[result.path] = (made.path, made)
        elif needs_verifying(result) and rel is not None:
            wanted[result.path] = (rel, request_for(result, rel, options, chosen))
        elif needs_verifying(result):
            outside.add(result.path)
    verdicts = verify([request for _, request in wanted.values()], config)
    out = []
    for result in results:
        if result.path in wanted:
            sites = annotate(wanted[result.path][0], result.sites, verdicts)
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
