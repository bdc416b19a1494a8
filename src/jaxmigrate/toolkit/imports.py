"""Removing imports a rewrite left unused, without a full scope analysis.

libcst's `RemoveImportsVisitor` needs `ScopeProvider`, the expensive part of name resolution. A
pass knows which local names it stopped using, so it asks for exactly those to be dropped; an
import goes only when its name is no longer read anywhere in the module (any scope, any spelling
as a `Name`), which is conservative: a name still used in a nested scope keeps its import.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any

import libcst as cst

from jaxmigrate.toolkit.names import dotted, walk


class _AllRead(Exception):
    """Every candidate is still read: the walk stops, no import goes."""


class _NameUses(cst.CSTVisitor):
    def __init__(self, candidates: Collection[str] = ()) -> None:
        self.used: set[str] = set()
        self.dotted_used: set[str] = set()
        self.imported: list[str] = []  # what each import alias binds: `a.b.c`, `np`, ...
        self.aliases: list[tuple[cst.ImportAlias, bool]] = []  # and whether a plain import
        # The candidates not yet seen read (a dotted one: as a chain it starts); none left:
        # `_AllRead` (an import is removed only when its candidate is not read).
        self.unread = set(candidates)

    def _read(self, name: str) -> None:
        if name in self.unread:
            self.unread.discard(name)
            if not self.unread:
                raise _AllRead

    def visit_Import(self, node: cst.Import) -> bool:
        self.imported.extend(filter(None, map(_bound_name, node.names)))
        self.aliases.extend((alias, True) for alias in node.names)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar):
            self.imported.extend(filter(None, map(_bound_name, node.names)))
            self.aliases.extend((alias, False) for alias in node.names)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.used.add(node.value)
        if "." not in node.value:
            self._read(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        name = dotted(node)
        if name is not None:
            self.dotted_used.add(name)
            if self.unread:
                for prefix in _prefixes(name):
                    if "." in prefix:
                        self._read(prefix)
        # `obj.name` reads `obj`, not a variable called `name`.
        walk(self, node.value)
        return False


def _prefixes(name: str) -> list[str]:
    """`a`, `a.b`, `a.b.c` for `a.b.c`."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _bound_name(alias: cst.ImportAlias) -> str | None:
    if alias.asname is not None:
        target = alias.asname.name
        return target.value if isinstance(target, cst.Name) else None
    name = dotted(alias.name)
    return None if name is None else name


def _fix_commas(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    if aliases and not isinstance(aliases[-1].comma, cst.MaybeSentinel):
        last = aliases[-1]
        aliases[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return aliases


class _Remover(cst.CSTTransformer):
    def __init__(self, candidates: Collection[str], uses: _NameUses) -> None:
        self.candidates = candidates
        self.uses = uses
        self.emptied: set[int] = set()

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        if original_node.body and not updated_node.body:
            self.emptied.add(id(original_node))
            return cst.RemoveFromParent()
        return updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._tidy(original_node.body, updated_node.body)
        return updated_node if body is updated_node.body else updated_node.with_changes(body=body)

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self._tidy(original_node.body, updated_node.body)
        return updated_node if body is updated_node.body else updated_node.with_changes(body=body)

    def _tidy(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> Sequence[cst.BaseStatement]:
        """Drop the blank lines a removed first import leaves at the top of its block; a removed
        import further down gives the blank lines above it to the statement after it, so the
        groups stay apart (`import jax` gone, `from jax import lax` stays in its group)."""
        updated = self._keep_group_breaks(original, updated)
        if not original or id(original[0]) not in self.emptied or not updated:
            return updated
        first = updated[0]
        if not isinstance(first, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return updated
        lines = list(first.leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        return [first.with_changes(leading_lines=lines), *updated[1:]]

    def _keep_group_breaks(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> Sequence[cst.BaseStatement]:
        if not any(id(stmt) in self.emptied for stmt in original[1:]):
            return updated
        kept = [stmt for stmt in original if id(stmt) not in self.emptied]
        if len(kept) != len(updated):
            return updated
        out = list(updated)
        blank = False  # a removed statement (not the block's first) had a blank line above
        for i, stmt in enumerate(original):
            if id(stmt) in self.emptied:
                lines = getattr(stmt, "leading_lines", ())
                blank = blank or (i > 0 and any(line.comment is None for line in lines))
                continue
            if blank:
                at = kept.index(stmt)
                new = out[at]
                own = list(getattr(new, "leading_lines", ()))
                if hasattr(new, "leading_lines") and not any(line.comment is None for line in own):
                    out[at] = new.with_changes(leading_lines=[cst.EmptyLine(), *own])
                blank = False
        return out

    def unused(self, alias: cst.ImportAlias, plain_import: bool) -> bool:
        bound = _bound_name(alias)
        if bound is None or bound not in self.candidates:
            return False
        if plain_import and alias.asname is None and "." in bound:
            # `import a.b.c` binds `a`; it is unused when no `a.b.c...` chain remains.
            prefix = bound + "."
            if any(d == bound or d.startswith(prefix) for d in self.uses.dotted_used):
                return False
            # ... and when `a` itself is still read, another import must keep binding it.
            top = bound.split(".")[0]
            return top not in self.uses.used or any(
                b.split(".")[0] == top and b not in self.candidates for b in self.uses.imported
            )
        return bound not in self.uses.used

    def leave_Import(
        self, original_node: cst.Import, updated_node: cst.Import
    ) -> cst.Import | cst.RemovalSentinel:
        kept = [a for a in updated_node.names if not self.unused(a, plain_import=True)]
        if not kept:
            return cst.RemoveFromParent()
        if len(kept) == len(updated_node.names):
            return updated_node
        return updated_node.with_changes(names=_fix_commas(kept))

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom | cst.RemovalSentinel:
        if isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        kept = [a for a in updated_node.names if not self.unused(a, plain_import=False)]
        if not kept:
            return cst.RemoveFromParent()
        if len(kept) == len(updated_node.names):
            return updated_node
        changes: dict[str, object] = {"names": _fix_commas(kept)}
        if len(kept) == 1 and updated_node.lpar is not None:
            changes.update(lpar=None, rpar=None)
        return updated_node.with_changes(**changes)


def remove_unused_imports(module: cst.Module, candidates: Collection[str]) -> cst.Module:
    """Return `module` without the imports binding `candidates` that nothing reads any more.

    `candidates` are local names (`pjit`, `shmap`) or, for a plain `import a.b.c`, the dotted
    module path.
    """
    if not candidates:
        return module
    uses = _NameUses(candidates)
    try:
        walk(uses, module)  # read-only: `module.visit` would rebuild every node
    except _AllRead:
        return module  # the usual case, found early: each candidate is still read
    remover = _Remover(candidates, uses)
    if not any(remover.unused(alias, plain) for alias, plain in uses.aliases):
        return module  # the usual case: nothing to remove, and no transform of the whole tree
    return module.visit(remover)


ImportRequest = tuple[str, str | None, str | None]  # (module, obj, asname)


def is_import_line(stmt: cst.CSTNode) -> bool:
    """A statement line of imports only."""
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def is_docstring(stmt: cst.CSTNode) -> bool:
    """A statement that is a string alone: a docstring when it comes first."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _existing(module: cst.Module) -> set[ImportRequest]:
    have: set[ImportRequest] = set()
    for stmt in module.body:
        if not is_import_line(stmt):
            continue
        assert isinstance(stmt, cst.SimpleStatementLine)
        for imp in stmt.body:
            if isinstance(imp, cst.Import):
                for a in imp.names:
                    asname = _bound_name(a) if a.asname is not None else None
                    have.add((dotted(a.name) or "", None, asname))
            elif isinstance(imp, cst.ImportFrom) and not isinstance(imp.names, cst.ImportStar):
                base = dotted(imp.module) if imp.module is not None and not imp.relative else None
                for a in imp.names:
                    asname = _bound_name(a) if a.asname is not None else None
                    have.add((base or "", dotted(a.name), asname))
    return have


def _make(request: ImportRequest) -> cst.SimpleStatementLine:
    module, obj, asname = request
    alias_as = cst.AsName(name=cst.Name(asname)) if asname else None
    if obj is None:
        node: cst.BaseSmallStatement = cst.Import(
            names=[cst.ImportAlias(name=cst.parse_expression(module), asname=alias_as)]  # type: ignore[arg-type]
        )
    else:
        node = cst.ImportFrom(
            module=cst.parse_expression(module),  # type: ignore[arg-type]
            names=[cst.ImportAlias(name=cst.Name(obj), asname=alias_as)],
        )
    return cst.SimpleStatementLine(body=[node])


def _merge_into(
    stmt: cst.SimpleStatementLine, extra: list[ImportRequest]
) -> cst.SimpleStatementLine:
    imp = stmt.body[0]
    assert isinstance(imp, cst.ImportFrom) and not isinstance(imp.names, cst.ImportStar)
    names = list(imp.names)
    last = names[-1]
    # The separator the statement uses between its names (`, `, or a newline and indent when
    # it is wrapped one name a line); a mixed layout gets `, ` after its last name, as written.
    seps = [a.comma for a in names[:-1]]
    sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    commas = [c for c in seps if isinstance(c, cst.Comma)]
    uniform = len(commas) == len(seps) and all(c.deep_equals(commas[0]) for c in commas)
    if commas and uniform:
        sep = commas[0]
    for _, obj, asname in extra:
        assert obj is not None
        alias_as = cst.AsName(name=cst.Name(asname)) if asname else None
        names.append(cst.ImportAlias(name=cst.Name(obj), asname=alias_as))
    keys = [_member_key(a) for a in imp.names]
    if uniform and keys == sorted(keys):  # isort's order kept: each name at its place
        names.sort(key=_member_key)
    if not uniform:
        names[len(imp.names) - 1] = last.with_changes(comma=sep)
    else:
        names = [a.with_changes(comma=sep) for a in names]
    names[-1] = names[-1].with_changes(comma=last.comma)
    return stmt.with_changes(body=[imp.with_changes(names=names)])


def _member_key(alias: cst.ImportAlias) -> tuple[int, str]:
    """isort's and ruff's order of the names of a from-import (`order-by-type`): constants,
    then classes, then the rest, each case-insensitively."""
    name = dotted(alias.name) or ""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower()


def _from_line_of(stmt: cst.CSTNode) -> str | None:
    """Return `M` if `stmt` is exactly one plain `from M import a, b` line."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    imp = stmt.body[0]
    if not isinstance(imp, cst.ImportFrom) or imp.relative or imp.module is None:
        return None
    if isinstance(imp.names, cst.ImportStar):
        return None
    return dotted(imp.module)


TYPING_MODULES = frozenset({"typing", "typing_extensions", "collections.abc"})


def _one_name_per_line(block: Sequence[cst.BaseStatement]) -> bool:
    """Return True if the file imports one name per `from` line (Google's style: `from flax
    import jax_utils`, `from flax import linen as nn`): new names get a line each too.

    Every `from` import of the block names one object (`typing` and `collections.abc` aside,
    which Google's style lets name several), and one module has several such lines, or there are
    at least three of them."""
    modules: list[str] = []
    for stmt in block:
        if not is_import_line(stmt):
            continue
        assert isinstance(stmt, cst.SimpleStatementLine)
        for imp in stmt.body:
            if isinstance(imp, cst.ImportFrom):
                if _module_of(stmt) in TYPING_MODULES:
                    continue  # Google's style allows several names from these
                if isinstance(imp.names, cst.ImportStar) or len(imp.names) != 1:
                    return False
                modules.append(_module_of(stmt))
    return len(modules) >= 3 or len(set(modules)) < len(modules)


def _top_block_end(body: Sequence[cst.BaseStatement]) -> int:
    """Return the index after the module's top import block (after a docstring, if any)."""
    at = 0
    for i, stmt in enumerate(body):
        if is_import_line(stmt) or (i == 0 and is_docstring(stmt)):
            at = i + 1
        elif at or i > 0:
            break
    return at


def add_imports(
    module: cst.Module, requests: Sequence[ImportRequest], first_party: Collection[str] = ()
) -> cst.Module:
    """Return `module` with the missing `requests` imported at its top.

    A `from M import x` joins a `from M import ...` line of the top import block; anything else
    goes where isort or ruff would put it: into the group of its section (standard library,
    third party, first party: `first_party` names the project's own top-level modules, and
    relative imports are first party too), at its sorted place when the group is sorted (in
    either isort's order or Google's), else after the last import of its section in the group;
    a section with no group of its own gets a new group between its neighbours. The user's own
    imports are never reordered, and imports further down are left alone: code above them runs
    before them. Only the module's top-level statements are read, so this costs nothing like
    libcst's `AddImportsVisitor`, which transforms the whole tree.
    """
    body = list(module.body)
    at = _top_block_end(body)
    have = _existing(module.with_changes(body=body[:at]))
    missing = [r for r in dict.fromkeys(requests) if r not in have]
    if not missing:
        return module
    single = _one_name_per_line(body[:at])
    by_module: dict[str, int] = {}
    for i, stmt in enumerate(body[:at]):
        name = _from_line_of(stmt)
        if name is not None and not single:
            by_module.setdefault(name, i)
    for index in sorted({by_module[r[0]] for r in missing if r[1] and r[0] in by_module}):
        joining = [r for r in missing if r[1] and by_module.get(r[0]) == index]
        statement = body[index]
        assert isinstance(statement, cst.SimpleStatementLine)
        body[index] = _merge_into(statement, joining)
    rest = [r for r in missing if not (r[1] and r[0] in by_module)]
    if not rest:
        return module.with_changes(body=body)
    # As libcst's AddImportsVisitor: plain imports first, then one from-import per module.
    rest.sort(key=lambda r: (r[1] is not None, r[0], r[1] or "", r[2] or ""))
    new = [_make(r) for r in rest if r[1] is None or single]
    for name in dict.fromkeys(r[0] for r in rest if r[1] is not None and not single):
        group = [r for r in rest if r[0] == name and r[1] is not None]
        new.append(_merge_into(_make(group[0]), group[1:]) if len(group) > 1 else _make(group[0]))
    if not any(is_import_line(stmt) for stmt in body[:at]):
        if at == 0 and body:
            new[0] = new[0].with_changes(leading_lines=body[0].leading_lines)
            body[0] = body[0].with_changes(leading_lines=[cst.EmptyLine()])
        return module.with_changes(body=[*body[:at], *new, *body[at:]])
    sections = frozenset(first_party)
    google = _google_sorted(body, at, module.default_indent)
    for statement in new:
        body, at = _place(body, at, statement, sections, google)
    return module.with_changes(body=body)


def _google_sorted(body: Sequence[cst.BaseStatement], at: int, indent: str) -> bool:
    """Return True if the file sorts its imports Google's way (`force_sort_within_sections`:
    `from m import x` among the `import` lines, by module): a group sorted so and not in isort's
    order says it; else, where every group fits both (only `import` lines), 2-space indentation
    (pyink, Google's style) does."""
    for group in _groups(body, at):
        google = any(_sorted(body, group, key) for key in (_google_key, _module_key))
        isort = _sorted(body, group, _isort_key)
        if google and not isort:
            return True
        if isort and not google:
            return False
    return indent == "  "


def _sorted(body: Sequence[cst.BaseStatement], group: list[int], key: Callable[..., Any]) -> bool:
    keys = [key(body[i]) for i in group]
    return keys == sorted(keys)


# isort's sections, in their order.
FUTURE, STDLIB, THIRD_PARTY, FIRST_PARTY = range(4)


def _section(stmt: cst.CSTNode, first_party: frozenset[str]) -> int:
    """Return the section of an import line (of its first import)."""
    assert isinstance(stmt, cst.SimpleStatementLine)
    imp = stmt.body[0]
    if isinstance(imp, cst.ImportFrom) and (imp.relative or imp.module is None):
        return FIRST_PARTY
    name = _module_of(stmt).split(".")[0]
    if name == "__future__":
        return FUTURE
    if name in sys.stdlib_module_names:
        return STDLIB
    return FIRST_PARTY if name in first_party else THIRD_PARTY


def _module_of(stmt: cst.CSTNode) -> str:
    assert isinstance(stmt, cst.SimpleStatementLine)
    imp = stmt.body[0]
    if isinstance(imp, cst.Import):
        return dotted(imp.names[0].name) or ""
    assert isinstance(imp, cst.ImportFrom)
    return ("." * len(imp.relative)) + (dotted(imp.module) or "" if imp.module else "")


def _isort_key(stmt: cst.CSTNode) -> tuple[bool, str]:
    """isort's and ruff's order: `import m` lines first, then `from m import` lines."""
    assert isinstance(stmt, cst.SimpleStatementLine)
    return isinstance(stmt.body[0], cst.ImportFrom), _module_of(stmt).lower()


def _google_key(stmt: cst.CSTNode) -> tuple[str, bool]:
    """Google's order (isort's google profile, `force_sort_within_sections` and
    `lexicographical`): by the full path of what is imported, whatever the statement (`from jax
    import lax` is `jax.lax`, between `import jax` and `import jax.numpy`)."""
    assert isinstance(stmt, cst.SimpleStatementLine)
    imp, path = stmt.body[0], _module_of(stmt)
    if isinstance(imp, cst.ImportFrom) and not isinstance(imp.names, cst.ImportStar):
        name = dotted(imp.names[0].name) or ""
        path = f"{path}.{name}" if path and not path.endswith(".") else path + name
    return path.lower(), isinstance(imp, cst.ImportFrom)


def _module_key(stmt: cst.CSTNode) -> tuple[str, bool]:
    """Google's order as some of its files keep it: by module alone (`from jax import random`
    is `jax`, before `import jax.numpy`)."""
    assert isinstance(stmt, cst.SimpleStatementLine)
    return _module_of(stmt).lower(), isinstance(stmt.body[0], cst.ImportFrom)


def _groups(body: Sequence[cst.BaseStatement], at: int) -> list[list[int]]:
    """Return the indices of the import lines of the top block, by group (blank-line separated)."""
    groups: list[list[int]] = []
    for i in range(at):
        stmt = body[i]
        if not is_import_line(stmt):
            continue
        assert isinstance(stmt, cst.SimpleStatementLine)
        blank = any(line.comment is None for line in stmt.leading_lines)
        if not groups or blank or groups[-1][-1] != i - 1:
            groups.append([])
        groups[-1].append(i)
    return groups


Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def _place(
    body: list[Statement],
    at: int,
    new: cst.SimpleStatementLine,
    first_party: frozenset[str],
    google: bool = False,
) -> tuple[list[Statement], int]:
    """Return `body` with `new` inserted into the top import block, and the block's new end."""
    section = _section(new, first_party)
    groups = _groups(body, at)
    mine = [g for g in groups if any(_section(body[i], first_party) == section for i in g)]
    if mine:
        top = _module_of(new).split(".")[0]
        kin = [g for g in mine if any(_module_of(body[i]).split(".")[0] == top for i in g)]
        # A module's own group, else the first of its section: a project's own modules not
        # known as such look third party, and their group comes after the real one.
        group = kin[-1] if kin else mine[0]
        index = _position_in(body, group, new, section, first_party, google)
        if index == group[0]:  # the group's first line: it takes over the group's blank lines
            new, body[index] = _take_blank_lines(new, body[index], [])
        return [*body[:index], new, *body[index:]], at + 1
    after = [g for g in groups if _section(body[g[0]], first_party) > section]
    if after:  # a group of its own before the first group of a later section
        index = after[0][0]
        new, body[index] = _take_blank_lines(new, body[index], [cst.EmptyLine()])
        return [*body[:index], new, *body[index:]], at + 1
    index = groups[-1][-1] + 1
    new = new.with_changes(leading_lines=[cst.EmptyLine()])
    return [*body[:index], new, *body[index:]], at + 1


def _take_blank_lines(
    new: cst.SimpleStatementLine, old: Statement, left: list[cst.EmptyLine]
) -> tuple[cst.SimpleStatementLine, Statement]:
    """Return `new`, put above `old`, with the blank lines above `old`, and `old` with `left`
    instead of them (comments above `old` stay with it)."""
    lines = list(old.leading_lines)
    split = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
    new = new.with_changes(leading_lines=lines[:split])
    return new, old.with_changes(leading_lines=[*left, *lines[split:]])


def _position_in(
    body: Sequence[cst.BaseStatement],
    group: list[int],
    new: cst.SimpleStatementLine,
    section: int,
    first_party: frozenset[str],
    google: bool = False,
) -> int:
    """Return where `new` goes in `group`: its sorted place, else after its section's last.

    A group whose sections are interleaved (Google's style sorts the project's own modules among
    the third-party ones: `from absl ...`, `from chex._src ...`, `import jax`) does not separate
    sections, so a sorted one takes the import at its sorted place, whatever its section.
    """
    sections = [_section(body[i], first_party) for i in group]
    earlier = [i for i, s in zip(group, sections) if s < section]
    later = [i for i, s in zip(group, sections) if s > section]
    low, high = (earlier[-1] + 1 if earlier else group[0]), (later[0] if later else group[-1] + 1)
    if sections != sorted(sections):
        low, high = group[0], group[-1] + 1
    google_keys = (_google_key, _module_key)
    for key in (*google_keys, _isort_key) if google else (_isort_key, *google_keys):
        keys = [key(body[i]) for i in group]
        if keys == sorted(keys):
            before = [i for i, k in zip(group, keys) if k <= key(new)]
            return min(max(before[-1] + 1 if before else group[0], low), high)
    top = _module_of(new).split(".")[0]
    kin = [i for i in range(low, high) if _module_of(body[i]).split(".")[0] == top]
    if kin:  # an unsorted group: after the last import of the same package
        return kin[-1] + 1
    same = [i for i, s in zip(group, sections) if s == section]
    return same[-1] + 1 if same else low
