"""The engine for one source text: prefilter, parse once, run the passes, apply the policy.

`migrate_source` is the pure core (text in, text and sites out) that the file pipeline
(`jaxmigrate.pipeline.files`), notebooks, the review UI and editor integrations share.
"""

from __future__ import annotations

import ast
import difflib
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import libcst as cst
from libcst import CSTNode
from libcst.codemod import CodemodContext

from jaxmigrate.model import Options, ProjectFile, Safety, Site, Skip, Status
from jaxmigrate.pipeline.prefilter import prefilter
from jaxmigrate.pipeline.project import Project
from jaxmigrate.registry import chosen_passes
from jaxmigrate.textio import source_lines
from jaxmigrate.toolkit.emit import Style, infer_style
from jaxmigrate.toolkit.facts import Outline
from jaxmigrate.toolkit.passes import (
    LATEST_JAX,
    STATE_KEY,
    Callers,
    FileState,
    Home,
    ModuleCache,
    Pass,
)

PassList = Sequence[type[Pass]]
# Where a file lives, or how to find it out: asked only when a pass will run on the text.
Located = Home | Callable[[], Home | None] | None


@dataclass(frozen=True)
class Migration:
    """The result of running passes over one source text."""

    code: str
    sites: tuple[Site, ...]
    skips: tuple[Skip, ...]
    files: tuple[ProjectFile, ...] = ()  # the project modules `code` imports, to write with it


@dataclass
class _Stage:
    """A pass as run, the module it returned and the keys of the sites it recorded."""

    pass_cls: type[Pass]
    module: cst.Module
    keys: frozenset[str]


@dataclass
class _Run:
    sites: list[Site] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    stages: list[_Stage] = field(default_factory=list)
    files: list[ProjectFile] = field(default_factory=list)


def line_map_between(original: Sequence[str], current: str) -> Callable[[int], int]:
    """Return a function mapping 1-based lines of `current` back to lines of `original`."""
    cur = source_lines(current, keepends=True)
    if list(original) == cur:
        return lambda line: line
    table: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, list(original), cur, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for j in range(j1, j2):
            if tag == "equal":
                table[j + 1] = i1 + (j - j1) + 1
            else:
                table[j + 1] = min(i1 + (j - j1), max(i2 - 1, i1)) + 1
    return lambda line: table.get(line, line)


def run_passes(
    module: cst.Module,
    source: str,
    passes: PassList,
    *,
    enabled: frozenset[str] | None = None,
    target_jax: tuple[int, int] = LATEST_JAX,
    target_source: str = "",
    path: str | None = None,
    selected: frozenset[str] | None = None,
    changed: bool = False,
    outline: Outline | None = None,
    home: Home | None = None,
    pmap_style: str = "idiomatic",
    pmap_replicated: tuple[str, ...] = (),
    style: Style | None = None,
    first_party: frozenset[str] = frozenset(),
    fallbacks: Mapping[str, str] | None = None,
    mesh_reads: tuple[str, ...] = (),
    outside: Callers | None = None,
    modules: tuple[tuple[str, str], ...] = (),
) -> tuple[cst.Module, _Run]:
    """Run `passes` in order over `module`; return the new module and what they recorded.

    `module` is the one parsed from `source`, or, `changed`, what earlier passes made of it.
    `selected` are the codes of every pass the user chose (default: those of `passes`).
    `outline` is that of Python's parse of `source`, if there was one (see `LazyPositions`).
    `home` says where the file lives (`Project.home`), for passes that share a module of the
    project. `style` is how new code is written (default: inferred from `source`),
    `first_party` the project's own top-level modules (new imports go above theirs).
    `fallbacks` are forms to write in their fallback form (`Site.fallback` key -> why).
    `mesh_reads` are where the code base reads the legacy mesh context, `outside` how its
    other modules use the module's functions, `modules` the code base's modules it imports.
    """
    style = infer_style(source) if style is None else style
    if selected is None:
        selected = frozenset(p.CODE for p in passes)
    original = source_lines(source, keepends=True)
    run = _Run()
    cache = ModuleCache(
        frozenset(q for p in passes for q in p.QUALNAMES),
        tuple({t for p in passes for t in p.NODE_TYPES}),
    )
    if not changed:
        cache.seed(module, source, outline)
    for pass_cls in passes:
        if not pass_cls.applies_to(source):
            continue
        state = FileState(
            enabled=enabled,
            target_jax=target_jax,
            target_source=target_source,
            selected=selected,
            original_lines=original,
            cache=cache,
            home=home,
            pmap_style=pmap_style,
            pmap_replicated=pmap_replicated,
            style=style,
            first_party=first_party,
            fallbacks=fallbacks or {},
            mesh_reads=mesh_reads,
            outside=outside,
            modules=modules,
        )
        if changed:
            state.line_map = line_map_between(original, cache.code(module))
        context = CodemodContext(filename=path, scratch={STATE_KEY: state})
        module = pass_cls(context).transform_module(module)
        changed = changed or state.changed
        run.sites.extend(state.sites)
        run.skips.extend(state.skips)
        run.files.extend(state.files)
        run.stages.append(_Stage(pass_cls, module, frozenset(s.key for s in state.sites)))
    return module, run


def initial_status(site: Site) -> Site:
    """Return `site` with the status it has before any verification ran."""
    status = Status.NOT_NEEDED if site.safety is Safety.SAFE else Status.UNVERIFIED
    return replace(site, status=status)


def decide(sites: Sequence[Site], unsafe_fixes: bool) -> tuple[Site, ...]:
    """Apply the default policy: mark which sites are written, and why the rest are not."""
    decided: list[Site] = []
    for site in sites:
        if site.status is Status.FAILED:
            decided.append(replace(site, applied=False, reason="failed verification"))
        elif site.safety is Safety.SAFE or site.status is Status.VERIFIED or unsafe_fixes:
            decided.append(replace(site, applied=True, reason=""))
        else:
            decided.append(
                replace(
                    site,
                    applied=False,
                    reason="unsafe and not verified",
                )
            )
    return enforce_groups(decided)


def enforce_groups(sites: Sequence[Site]) -> tuple[Site, ...]:
    """Unapply every site of a group one of whose members is not applied."""
    blocked = {s.group for s in sites if s.group is not None and not s.applied}
    out = []
    for site in sites:
        if site.applied and site.group in blocked:
            site = replace(
                site, applied=False, reason="depends on another site of its group, not applied"
            )
        out.append(site)
    return tuple(out)


PYTHON_MAX_BRACKETS = 200  # CPython's tokenizer refuses deeper nesting of brackets
_BRACKETS = re.compile(r"[][(){}]")


def safe_alone(sites: Sequence[Site]) -> frozenset[str]:
    """Return the keys of safe sites that can be applied alone (no unsafe site in their group)."""
    tied = {s.group for s in sites if s.group is not None and s.safety is Safety.UNSAFE}
    return frozenset(s.key for s in sites if s.safety is Safety.SAFE and s.group not in tied)


def parse_module(code: str) -> cst.Module:
    """Return `cst.parse_module(code)`, without validating again every node the parser built.

    libcst checks each node as it is constructed (`CSTNode.__post_init__` -> `_validate`),
    also those its own parser makes, which are valid by construction; libcst's source notes
    the cost (a PERF comment there). It is 15% of parse time: 1.70 s -> 1.45 s on JAX's
    tests/pjit_test.py. The check is off only while the parser runs; nodes built by the passes
    are checked as usual.
    """
    saved = CSTNode.__dict__["__post_init__"]
    CSTNode.__post_init__ = _built_by_the_parser  # type: ignore[method-assign]
    try:
        return cst.parse_module(code)
    finally:
        CSTNode.__post_init__ = saved  # type: ignore[method-assign]


def _built_by_the_parser(self: CSTNode) -> None:
    """`CSTNode.__post_init__` while libcst's parser builds a tree: nothing to check."""


def refuse_deep_nesting(code: str) -> None:
    """Raise RecursionError for code nested more deeply than Python itself can parse.

    libcst's native parser overflows its stack on such input and takes the whole process down
    (a segmentation fault, not an exception). Python's own parser says when code is too deep;
    when it rejects the code for another reason, brackets nested deeper than it allows are
    enough to refuse it.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(code)
    except (RecursionError, MemoryError):
        raise RecursionError("nested too deeply for Python's parser") from None
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg) or _bracket_depth(code) > PYTHON_MAX_BRACKETS:
            raise RecursionError("nested too deeply for Python's parser") from None
    except ValueError:
        pass  # NUL bytes: libcst reports those itself


def _bracket_depth(code: str) -> int:
    depth = deepest = 0
    for match in _BRACKETS.finditer(code):
        if match.group() in "([{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(depth - 1, 0)
    return deepest


def migrate_source(
    code: str,
    *,
    options: Options | None = None,
    passes: PassList | None = None,
    accept: Callable[[Sequence[Site]], Sequence[Site]] | None = None,
    path: str | None = None,
    home: Located = None,
    project: Project | None = None,
    fallbacks: Mapping[str, str] | None = None,
) -> Migration:
    """Migrate one source text and return the new code with its sites and skips.

    New code follows the file's style: the formatter configuration of the project at `path`
    (read through `project`, which keeps what it read for the next file), else the code's own.
    `home` (`Project.home(path, code)`, or a function returning it, called only when a pass
    runs) lets passes put a helper in one module of the project, imported where needed: the new
    code then comes with the project files it imports.

    Every site is decided by the default policy (`options.unsafe_fixes`), then by `accept`, which
    may turn sites on or off (verification and interactive review plug in there). `fallbacks`
    are forms verification found wrong, written in their fallback form (`Site.fallback`). Raises
    `libcst.ParserSyntaxError` for code that does not parse, RecursionError for code nested too
    deeply to parse.
    """
    options = options or Options()
    chosen = chosen_passes(options) if passes is None else passes
    selected = frozenset(p.CODE for p in chosen)
    found = prefilter(code, chosen)
    if not found.passes:
        return Migration(code, (), ())
    if found.outline is None:  # else Python's parser just took it: not too deep
        refuse_deep_nesting(code)
    module = parse_module(code)
    project = project or Project()
    if callable(home):
        home = home()
    reads = project.legacy_mesh_reads(path, code) if any(p.READS_MESH for p in found.passes) else ()
    outside = project.outside_uses(path) if any(p.READS_CALLERS for p in found.passes) else None
    reading = any(p.READS_IMPORTS for p in found.passes)
    modules = project.imported_modules(path, code) if reading else ()
    layout = _Layout(project.style(code, path), project.first_party(path), reads, outside, modules)
    new, run = run_passes(
        module,
        code,
        found.passes,
        target_jax=options.target_jax,
        target_source=options.target_source,
        path=path,
        selected=selected,
        outline=found.outline,
        home=home,
        pmap_style=options.pmap_style,
        pmap_replicated=options.pmap_replicated,
        style=layout.style,
        first_party=layout.first_party,
        fallbacks=fallbacks,
        mesh_reads=layout.mesh_reads,
        outside=layout.outside,
        modules=layout.modules,
    )
    if not run.sites:
        return Migration(code, (), tuple(sorted(run.skips, key=lambda s: (s.line, s.col))))
    sites = decide([initial_status(s) for s in run.sites], options.unsafe_fixes)
    if accept is not None:
        sites = enforce_groups(accept(sites))
    applied = frozenset(s.key for s in sites if s.applied)
    if applied and len(applied) != len(sites):  # none applied: the code is the original
        again = _Again(options, path, selected, layout, found.outline, home, fallbacks)
        new = _rerun(module, code, run.stages, applied, again)
    by_place = tuple(sorted(sites, key=lambda s: (s.line, s.col)))
    skips = tuple(sorted(run.skips, key=lambda s: (s.line, s.col)))
    return Migration(new.code if applied else code, by_place, skips, needed(run.files, applied))


def needed(files: Sequence[ProjectFile], applied: frozenset[str]) -> tuple[ProjectFile, ...]:
    """Return the requested project files some applied site needs, one per path."""
    out: dict[str, ProjectFile] = {}
    for file in files:
        if file.keys & applied:
            out.setdefault(file.path, file)
    return tuple(out.values())


@dataclass(frozen=True)
class _Layout:
    style: Style
    first_party: frozenset[str]
    mesh_reads: tuple[str, ...] = ()
    outside: Callers | None = None
    modules: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _Again:
    """What a re-run of the passes takes from the first run besides its stages."""

    options: Options
    path: str | None
    selected: frozenset[str]
    layout: _Layout
    outline: Outline | None
    home: Home | None
    fallbacks: Mapping[str, str] | None


def _rerun(
    module: cst.Module,
    code: str,
    stages: Sequence[_Stage],
    applied: frozenset[str],
    again: _Again,
) -> cst.Module:
    """Return `module` with just the `applied` sites rewritten, after a run that rewrote all.

    The leading passes all of whose sites are applied made what they made in that run: their
    result is taken as it is, and only the passes after them run again. A pass with no site to
    rewrite changes nothing, so when none of those has one, nothing runs again at all.
    """
    done = 0
    while done < len(stages) and stages[done].keys <= applied:
        done += 1
    start = stages[done - 1].module if done else module
    rest = stages[done:]
    if not any(stage.keys & applied for stage in rest):
        return start
    new, _ = run_passes(
        start,
        code,
        [stage.pass_cls for stage in rest],
        enabled=applied,
        target_jax=again.options.target_jax,
        target_source=again.options.target_source,
        path=again.path,
        selected=again.selected,
        changed=start is not module,
        outline=again.outline,
        home=again.home,
        pmap_style=again.options.pmap_style,
        pmap_replicated=again.options.pmap_replicated,
        style=again.layout.style,
        first_party=again.layout.first_party,
        fallbacks=again.fallbacks,
        mesh_reads=again.layout.mesh_reads,
        outside=again.layout.outside,
        modules=again.layout.modules,
    )
    return new


def describe_syntax_error(exc: cst.ParserSyntaxError, code: str | None = None) -> str:
    """Return a one-line message for a parse error.

    Given the code, Python's own message is preferred when Python rejects it too: it says what
    is wrong ("Missing parentheses in call to 'print'") where libcst lists the tokens it wanted.
    """
    if code is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ast.parse(code)
        except SyntaxError as error:
            message = str(error.msg).strip().splitlines()[0] if error.msg else "invalid syntax"
            return f"cannot parse: line {error.lineno}, column {error.offset}: {message}"
        except (ValueError, RecursionError, MemoryError):
            pass
    message = str(exc.message).strip().splitlines()[0]
    return f"cannot parse: line {exc.raw_line}, column {exc.raw_column + 1}: {message}"
