"""Jupyter notebooks: each code cell migrated on its own, the JSON written back as it was.

The notebook is read with `json` (to validate it and find its cells), but it is never
re-serialized. Only the `source` values of the cells that changed are replaced in the original
text, each in the style its old value had (a list of lines with the same indentation and
separators, or one string; non-ASCII escaped or not, as in the file). Everything else, outputs,
metadata, key order, indentation, float spellings, escapes and the trailing newline, stays byte
for byte, and a notebook in which nothing changes is not touched at all. Neither `nbformat` nor
`json.dumps` can promise that: `nbformat.write` sorts keys and fixes the indentation at 1 (Colab
writes 2, in its own key order), both re-spell floats (`1e-7` becomes `1e-07`) and escapes
(`\\/`, `\\u00e9`) in cells nobody touched, and nbformat may upgrade or strip fields on the way.

IPython syntax is kept out of libcst's way. A cell starting with a cell magic (`%%time`,
`%%bash`, ...) is left alone entirely (a skip is reported if it mentions a legacy API). In other
cells, a line that starts a statement with a line magic (`%matplotlib inline`, or `timeit f(x)`
written without its `%`, as IPython's automagic allows), a shell escape
(`!pip install ...`), a help request (`?jax.pmap`, `jax.pmap??`) or an assignment from one
(`files = !ls`) is masked with a `pass` statement carrying a unique marker before the passes
run, and restored, at the indentation its placeholder ends up with, afterwards. Lines inside
brackets or strings are never masked (`% b` continuing `(a` is Python's modulo).

The code cells are migrated as one module, since they run in one namespace: an import in the
first cell resolves a `pmap` in the fifth, and an import a rewrite leaves unused is removed
wherever it is. Each cell but the first follows a `pass` line carrying a cell marker, by which
the module is split back after the passes ran. Cells are numbered from 1 among the code cells, as
ruff numbers them; sites and skips report the cell and their line within it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import libcst as cst

from jaxmigrate.model import Options, Safety, Site, Skip
from jaxmigrate.pipeline.engine import Migration, describe_syntax_error, migrate_source
from jaxmigrate.pipeline.prefilter import passes_for
from jaxmigrate.pipeline.project import Project
from jaxmigrate.registry import chosen_passes
from jaxmigrate.toolkit.passes import Home

if TYPE_CHECKING:
    from jaxmigrate.toolkit.passes import Pass

NOT_VERIFIED = (
    "not verified by execution yet: with verification on, the notebook's code cells are run "
    "in order on both sides; else review the diff, then pass --unsafe-fixes"
)
_IPYTHON = re.compile(
    r"""[ \t]*(?:
        [%!?]                                   # %magic, !shell, ?help
      | [\w.]+[ \t]*\?{1,2}[ \t]*$              # obj?  obj??
      | [\w.,()\[\]* \t]+=[ \t]*[%!]            # files = !ls   out = %timeit f()
    )""",
    re.VERBOSE,
)
# IPython's line magics, which automagic (on by default) runs without their `%`.
_LINE_MAGICS = frozenset(
    """alias alias_magic autoawait autocall automagic bookmark cd clear colors conda config
    debug dhist dirs doctest_mode ed edit env gui hist history killbgscripts ldir less load
    load_ext loadpy logoff logon logstart logstate logstop ls lsmagic macro magic man
    matplotlib mkdir more notebook page pastebin pdb pdef pdoc pfile pinfo pinfo2 pip popd
    pprint precision prun psearch psource pushd pwd pycat pylab quickref recall rehashx
    reload_ext rep rerun reset reset_selective rm rmdir run save sc set_env store sx system tb
    time timeit unalias unload_ext who who_ls whos xdel xmode""".split()  # noqa: SIM905
)
_AUTOMAGIC = re.compile(r"[ \t]*([A-Za-z_]\w*)[ \t]+\S")
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_PYTHON_NAMES = {"python", "python3", "ipython", "ipython3"}


class NotebookError(Exception):
    """A notebook that cannot be migrated; the message is one line. `skipped`: not our kind."""

    def __init__(self, message: str, *, skipped: bool = False) -> None:
        super().__init__(message)
        self.skipped = skipped


@dataclass(frozen=True)
class Masked:
    """A cell's code with its IPython lines replaced by placeholders, and how to put them back.

    `lines[i]` is the i-th masked line and whether it begins its magic (restored at the
    indentation its placeholder has then) or continues one after a backslash (restored as it was).
    """

    code: str
    marker: str
    lines: tuple[tuple[str, bool], ...]

    def restore(self, code: str) -> str:
        """Return `code` with every placeholder replaced by its IPython line; raise ValueError."""
        if not self.lines:
            return code
        pattern = re.compile(rf"^([ \t]*)pass  # {self.marker}:(\d+)(?=\r?$)", re.MULTILINE)
        seen: list[int] = []

        def put_back(match: re.Match[str]) -> str:
            number = int(match.group(2))
            seen.append(number)
            original, head = self.lines[number]
            return match.group(1) + original.lstrip(" \t") if head else original

        restored = pattern.sub(put_back, code)
        if sorted(seen) != list(range(len(self.lines))):
            raise ValueError("a rewrite moved or dropped an IPython line")
        return restored


def split_lines(text: str) -> list[str]:
    """Return `text` cut after each newline, as notebook `source` lists hold it."""
    return re.findall(r"[^\n]*\n|[^\n]+", text)


def _scan(line: str, depth: int, quote: str) -> tuple[int, str, bool]:
    """Return bracket depth, open string delimiter and backslash continuation after `line`."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quote:
            if line.startswith(quote, i):
                i, quote = i + len(quote), ""
                continue
            i += 2 if c == "\\" else 1
            continue
        if c == "#":
            return depth, quote, False
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif c in "'\"":
            quote = line[i : i + 3] if line[i : i + 3] in ('"""', "'''") else c
            i += len(quote)
            continue
        i += 1
    if len(quote) == 1:
        quote = ""  # an unterminated one-line string ends with its line
    return depth, quote, not quote and line.rstrip("\r\n").endswith("\\")


def _automagic(line: str) -> bool:
    """Return True for a line magic written without its `%` (`timeit -n 5 f(x)`): a magic's name,
    then arguments, on a complete line that is not Python (`time = 3` and `time -x` are)."""
    match = _AUTOMAGIC.match(line)
    if match is None or match.group(1) not in _LINE_MAGICS:
        return False
    depth, quote, continued = _scan(line, 0, "")
    if depth or quote or continued:
        return False
    try:
        compile(line.strip(), "<cell>", "exec")
    except SyntaxError:
        return True
    return False


def mask(source: str) -> Masked | None:
    """Return the cell with its IPython lines masked; None for a cell magic (left alone)."""
    if source.lstrip().startswith("%%"):
        return None
    marker = "jaxmigrate-ipython-" + hashlib.blake2b(source.encode(), digest_size=6).hexdigest()
    kept: list[tuple[str, bool]] = []
    out: list[str] = []
    depth, quote, continued, carrying, indent = 0, "", False, False, ""
    for line in split_lines(source):
        starts = depth == 0 and not quote and not continued
        if carrying or (starts and (_IPYTHON.match(line) or _automagic(line))):
            body = line.rstrip("\r\n")
            if not carrying:
                indent = line[: len(line) - len(line.lstrip(" \t"))]
            out.append(f"{indent}pass  # {marker}:{len(kept)}{line[len(body) :]}")
            kept.append((body, not carrying))
            carrying = body.endswith("\\")
            continue
        out.append(line)
        depth, quote, continued = _scan(line, depth, quote)
    return Masked("".join(out), marker, tuple(kept))


@dataclass(frozen=True)
class _Cell:
    index: int  # position in the notebook's `cells`
    number: int  # 1-based among code cells
    source: str


def load(text: str) -> dict[str, Any]:
    """Return the notebook document; raise NotebookError (one line) when it is not one we take."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(
            f"not valid notebook JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:
        raise NotebookError("not valid notebook JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise NotebookError("not a Jupyter notebook: the JSON is not an object")
    if "cells" not in document and "worksheets" in document:
        raise NotebookError(
            "nbformat 3 notebook; convert it first: jupyter nbconvert --to notebook "
            "--nbformat 4 --inplace NOTEBOOK",
            skipped=True,
        )
    if not isinstance(document.get("cells"), list):
        raise NotebookError("not a Jupyter notebook: no `cells` list")
    language = _language(document.get("metadata"))
    if language is not None and language.lower() not in _PYTHON_NAMES:
        raise NotebookError(f"not a Python notebook (language: {language})", skipped=True)
    return document


def _language(metadata: Any) -> str | None:
    if not isinstance(metadata, dict):
        return None
    for section, key in (("language_info", "name"), ("kernelspec", "language")):
        value = metadata.get(section)
        if isinstance(value, dict) and isinstance(value.get(key), str):
            return str(value[key])
    return None


def code_cells(document: dict[str, Any]) -> list[_Cell]:
    """Return the notebook's code cells with their joined source."""
    cells: list[_Cell] = []
    for index, cell in enumerate(document["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise NotebookError(f"cell {len(cells) + 1}: `source` is not text")
        cells.append(_Cell(index, len(cells) + 1, source))
    return cells


def cell_sources(text: str) -> list[tuple[int, str]]:
    """Return (cell number, source) of each code cell of a notebook's text."""
    return [(c.number, c.source) for c in code_cells(load(text))]


@dataclass(frozen=True)
class _Part:
    cell: _Cell
    masked: Masked
    first_line: int  # where the cell starts in the module, 1-based
    newline_added: bool


@dataclass(frozen=True)
class _Module:
    """The notebook's code cells as one module, each after a `pass` carrying a cell marker.

    What a pass puts at the very top of the module (the imports it needs, when the first cell
    does not start with imports) lands before the first marker; it is moved into the first cell
    that has imports, after them, rather than above a first cell of `!pip install` lines.
    """

    code: str
    parts: tuple[_Part, ...]
    marker: str

    @classmethod
    def build(cls, cells: Sequence[tuple[_Cell, Masked]]) -> _Module:
        """Join the masked cells, a separator line between two cells."""
        marker = (
            "jaxmigrate-cell-"
            + hashlib.blake2b(
                "\0".join(m.code for _, m in cells).encode(), digest_size=6
            ).hexdigest()
        )
        chunks: list[str] = []
        parts: list[_Part] = []
        line = 1
        for cell, masked in cells:
            chunks.append(f"pass  # {marker}:{cell.number}\n")
            line += 1
            code = masked.code
            added = bool(code) and not code.endswith("\n")
            code += "\n" if added else ""
            parts.append(_Part(cell, masked, line, added))
            chunks.append(code)
            line += code.count("\n")
        return cls("".join(chunks), tuple(parts), marker)

    def locate(self, line: int) -> tuple[_Part, int]:
        """Return the cell holding module line `line`, and the line within that cell."""
        part = self.parts[0]
        for candidate in self.parts:
            if candidate.first_line > line:
                break
            part = candidate
        return part, line - part.first_line + 1

    def in_cell(self, record: Any) -> Any:
        """Return a site or skip located by cell and line within the cell."""
        part, line = self.locate(record.line)
        out = replace(record, line=line, cell=part.cell.number)
        if isinstance(out, Site) and out.safety is Safety.UNSAFE:
            out = replace(out, details={"verification": NOT_VERIFIED, **out.details})
        return out

    def split(self, code: str) -> dict[int, str]:
        """Return the new source of each cell whose code changed, by index in `cells`."""
        pattern = re.compile(rf"^pass  # {self.marker}:(\d+)\r?\n", re.MULTILINE)
        numbers = [int(n) for n in pattern.findall(code)]
        if numbers != [p.cell.number for p in self.parts]:
            raise NotebookError("a rewrite moved a cell boundary; not migrated")
        header, *rest = pattern.split(code)[::2]
        segments = _place_header(header, rest)
        sources: dict[int, str] = {}
        for part, segment in zip(self.parts, segments, strict=True):
            if part.newline_added and segment.endswith("\n"):
                segment = segment[:-1]
            try:
                new = part.masked.restore(segment)
            except ValueError as exc:
                raise NotebookError(f"cell {part.cell.number}: {exc}; not migrated") from None
            if new != part.cell.source:
                sources[part.cell.index] = new
        return sources


def _place_header(header: str, segments: list[str]) -> list[str]:
    """Return `segments` with the `header` lines put after the imports of the first cell that
    imports the same package (`jax`), else of the first cell with imports, else at the top of
    the first cell: a notebook sets `XLA_FLAGS` and the like before it imports JAX."""
    lines = split_lines(header.strip("\n") + "\n") if header.strip() else []
    if not lines:
        return segments
    packages = _packages(header)
    ends = [_end_of_first_imports(segment) for segment in segments]
    chosen = next((i for i, e in enumerate(ends) if e and packages & e[1]), None)
    if chosen is None:
        chosen = next((i for i, e in enumerate(ends) if e), None)
    if chosen is None:
        segments[0] = "".join(lines) + segments[0]
        return segments
    end = ends[chosen]
    assert end is not None
    cut = split_lines(segments[chosen])
    segments[chosen] = "".join([*cut[: end[0]], *lines, *cut[end[0] :]])
    return segments


def _packages(code: str) -> set[str]:
    """Return the top-level packages the import statements of `code` name."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError):
        return set()
    found = set()
    for stmt in body:
        if isinstance(stmt, ast.Import):
            found |= {a.name.split(".")[0] for a in stmt.names}
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
            found.add(stmt.module.split(".")[0])
    return found


def _end_of_first_imports(code: str) -> tuple[int, set[str]] | None:
    """Return the line after the first run of top-level imports in `code` and the packages
    that run imports, or None."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError):
        return None
    imports = [isinstance(s, (ast.Import, ast.ImportFrom)) for s in body]
    if True not in imports:
        return None
    first = last = imports.index(True)
    while last + 1 < len(body) and imports[last + 1]:
        last += 1
    end = body[last].end_lineno
    assert end is not None
    run = "\n".join(ast.unparse(s) for s in body[first : last + 1])
    return end, _packages(run)


def migrate_notebook(
    text: str,
    *,
    options: Options,
    accept: Callable[[Sequence[Site]], Sequence[Site]] | None = None,
    path: str | None = None,
    project: Project | None = None,
    fallbacks: Mapping[str, str] | None = None,
) -> Migration:
    """Migrate the code cells of a notebook's JSON text; return the new text, sites and skips.

    `fallbacks` are the forms verification chose to write in their fallback form, as for a
    Python file (`FileResult.fallbacks`: a program-level pmap step that failed, faithful now).

    Given `project` (and `path`), a module shared by the code base (the pmap helper) is imported
    when the notebook imports the code base's main package, else defined in the notebook
    (`Project.notebook_home`); the shared module's file is in `Migration.files` then.

    The cells run as one namespace, so they are migrated as one module (an import in the first
    cell resolves a `pmap` in the fifth; an import left unused anywhere is removed), then split
    back. Raises NotebookError for a document that is not a Python notebook, or for a cell that
    mentions a legacy API and cannot be parsed (the message names the cell); a cell that cannot
    be parsed but mentions none is left out.
    """
    document = load(text)
    passes = chosen_passes(options)
    if not any(p.applies_to(c.source) for c in code_cells(document) for p in passes):
        return Migration(text, (), ())  # most notebooks: no legacy name anywhere, nothing parsed
    cells, skips = _cells_to_migrate(document, passes)
    if not cells:
        return Migration(text, (), tuple(skips))
    module = _Module.build(cells)
    by_key: dict[str, Site] = {}

    def home() -> Home | None:
        if project is None or path is None:
            return None
        return project.notebook_home(Path(path), module.code)

    def in_module(sites: Sequence[Site]) -> list[Site]:
        assert accept is not None
        by_key.update((s.key, s) for s in sites)
        decided = accept([module.in_cell(s) for s in sites])
        return [replace(s, line=by_key[s.key].line, cell=None) for s in decided]

    try:
        migration = migrate_source(
            module.code,
            options=options,
            passes=passes,
            accept=in_module if accept is not None else None,
            path=path,
            home=home,
            project=project,
            fallbacks=fallbacks,
        )
    except cst.ParserSyntaxError as exc:
        part, line = module.locate(exc.raw_line)
        message = describe_syntax_error(exc).replace(f"line {exc.raw_line},", f"line {line},", 1)
        raise NotebookError(f"cell {part.cell.number}: {message}") from None
    sites = sorted((module.in_cell(s) for s in migration.sites), key=_place)
    skips.extend(module.in_cell(s) for s in migration.skips)
    sources = module.split(migration.code) if migration.code != module.code else {}
    new_text = splice(text, sources) if sources else text
    return Migration(
        new_text, tuple(sites), tuple(sorted(skips, key=_place)), files=migration.files
    )


def _place(record: Site | Skip) -> tuple[int, int, int]:
    return record.cell or 0, record.line, record.col


def _cells_to_migrate(
    document: dict[str, Any], passes: Sequence[type[Pass]]
) -> tuple[list[tuple[_Cell, Masked]], list[Skip]]:
    """Return the masked cells to migrate, and skips for the cells left alone."""
    cells: list[tuple[_Cell, Masked]] = []
    skips: list[Skip] = []
    for cell in code_cells(document):
        masked = mask(cell.source)
        if masked is None:
            magic, _, body = cell.source.lstrip().partition("\n")
            reason = f"in a {magic.split()[0]} cell: cell magics are left alone"
            skips.extend(
                Skip(p.CODE, p.NAME, 1, 1, reason, cell=cell.number)
                for p in passes
                if p.applies_to(body)
            )
            continue
        try:
            ast.parse(masked.code)
        except (SyntaxError, ValueError) as exc:
            if passes_for(masked.code, passes):
                where = f"line {getattr(exc, 'lineno', '?')}, column {getattr(exc, 'offset', '?')}"
                message = getattr(exc, "msg", str(exc))
                raise NotebookError(
                    f"cell {cell.number}: cannot parse: {where}: {message}"
                ) from None
            continue  # IPython syntax we do not know, in a cell with nothing to migrate
        except RecursionError:
            raise NotebookError(f"cell {cell.number}: too deeply nested for the parser") from None
        cells.append((cell, masked))
    return cells, skips


# Writing back -------------------------------------------------------------------------------
def _ws(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match else i


def _members(text: str, i: int) -> Iterator[tuple[str, int, int]]:
    """Yield (key, value start, value end) of the JSON object starting at `i`."""
    i = _ws(text, i + 1)
    if text[i] == "}":
        return
    while True:
        key, i = _DECODER.raw_decode(text, i)
        i = _ws(text, _ws(text, i) + 1)  # the colon
        end = _DECODER.raw_decode(text, i)[1]
        yield key, i, end
        i = _ws(text, end)
        if text[i] != ",":
            return
        i = _ws(text, i + 1)


def _elements(text: str, i: int) -> Iterator[tuple[int, int]]:
    """Yield (start, end) of each value of the JSON array starting at `i`."""
    i = _ws(text, i + 1)
    if text[i] == "]":
        return
    while True:
        end = _DECODER.raw_decode(text, i)[1]
        yield i, end
        i = _ws(text, end)
        if text[i] != ",":
            return
        i = _ws(text, i + 1)


def source_spans(text: str) -> dict[int, tuple[int, int]]:
    """Return, per index in `cells`, where that cell's `source` value lies in the JSON text."""
    spans: dict[int, tuple[int, int]] = {}
    for key, start, _ in _members(text, _ws(text, 0)):
        if key != "cells":
            continue
        spans.clear()  # a repeated key: json keeps the last one, and so do we
        for index, (cell_start, _) in enumerate(_elements(text, start)):
            for cell_key, value_start, value_end in _members(text, cell_start):
                if cell_key == "source":
                    spans[index] = (value_start, value_end)
    return spans


def _escapes_non_ascii(text: str) -> bool:
    return text.isascii() and re.search(r"\\u(?!00[0-7])[0-9a-fA-F]{4}", text) is not None


def encode_source(old_value: str, source: str, ensure_ascii: bool) -> str:
    """Return `source` as a JSON value spelled the way `old_value` (its old JSON text) was."""
    if not old_value.startswith("["):
        return json.dumps(source, ensure_ascii=ensure_ascii)
    items = list(_elements(old_value, 0))
    if items:
        prefix = old_value[1 : items[0][0]]
        suffix = old_value[items[-1][1] : -1]
        sep = old_value[items[0][1] : items[1][0]] if len(items) > 1 else "," + prefix
    else:
        prefix, suffix, sep = "", "", ", "
    parts = [json.dumps(line, ensure_ascii=ensure_ascii) for line in split_lines(source)]
    if not parts:
        return "[]"
    return "[" + prefix + sep.join(parts) + suffix + "]"


def splice(text: str, sources: dict[int, str]) -> str:
    """Return the notebook `text` with the `source` of the cells in `sources` replaced."""
    spans = source_spans(text)
    ensure_ascii = _escapes_non_ascii(text)
    out: list[str] = []
    last = 0
    for index in sorted(sources):
        start, end = spans[index]
        out.append(text[last:start])
        out.append(encode_source(text[start:end], sources[index], ensure_ascii))
        last = end
    out.append(text[last:])
    return "".join(out)


def changed_cells(old: str, new: str) -> list[tuple[int, str, str]]:
    """Return (cell number, old source, new source) of the code cells that differ."""
    before, after = cell_sources(old), cell_sources(new)
    return [(n, a, b) for (n, a), (_, b) in zip(before, after, strict=False) if a != b]
