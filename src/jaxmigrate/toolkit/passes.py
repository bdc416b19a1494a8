"""The base class every pass in `codemods/` derives from, and the per-file state passes share.

A pass is a libcst codemod command (so `python -m libcst.tool codemod -x
jaxmigrate.codemods.pjit.Pjit PATH` runs it on its own) that also reports what it found: each
rewrite it could make is a `Site`, each construct it leaves alone on purpose is a `Skip`. The
engine can re-run a pass with only some sites enabled; `Pass.site()` answers whether to rewrite.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst
from libcst.codemod import CodemodCommand, CodemodContext
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from jaxmigrate.model import LATEST_JAX, ProjectFile, Safety, Site, Skip
from jaxmigrate.textio import source_lines
from jaxmigrate.toolkit.emit import Room, Style, code, fit_call, keep_trailing_comment
from jaxmigrate.toolkit.imports import ImportRequest, add_imports, remove_unused_imports
from jaxmigrate.toolkit.positions import LazyPositions, Positions
from jaxmigrate.toolkit.scope import ScopeModel

if TYPE_CHECKING:
    from jaxmigrate.toolkit.facts import AstFacts, Outline

STATE_KEY = "jaxmigrate.state"
_UNSET: Any = object()
SUPPRESS = re.compile(r"#\s*jaxmigrate:\s*skip(?:\[([A-Za-z0-9,\s]+)\])?")


class ModuleCache:
    """The scope model and positions of a module, computed lazily and shared by the passes.

    The engine keeps a pass's input module when the pass changed nothing, so these carry over
    to the next pass: most passes resolve names once and never compute positions at all.
    """

    def __init__(
        self, watch: Collection[str] = (), watch_types: tuple[type[cst.CSTNode], ...] = ()
    ) -> None:
        self.watch = frozenset(watch)
        self.watch_types = watch_types
        self._module: cst.Module | None = None
        self._names: ScopeModel | None = None
        self._positions: Positions | LazyPositions | None = None
        self._code: str | None = None
        self._lines: list[str] | None = None
        self._outline: Outline | None = None

    def _switch(self, module: cst.Module) -> None:
        if module is not self._module:
            self._module, self._names, self._positions = module, None, None
            self._code, self._lines = None, None
            self._outline = None

    def seed(self, module: cst.Module, code: str, outline: Outline | None = None) -> None:
        """Record that `module`'s code is `code` (the source it was parsed from), and the
        outline of Python's own parse of it, if there is one (see `LazyPositions`)."""
        self._switch(module)
        self._code = code
        self._outline = outline

    def code(self, module: cst.Module) -> str:
        """Return `module.code`, generated at most once per module version."""
        self._switch(module)
        if self._code is None:
            self._code = module.code
        return self._code

    def lines(self, module: cst.Module) -> list[str]:
        """Return the lines of `module`'s code (see `textio.source_lines`)."""
        self._switch(module)
        if self._lines is None:
            self._lines = source_lines(self.code(module))
        return self._lines

    def names(self, module: cst.Module) -> ScopeModel:
        """Return the scope model of `module` (scopes, bindings, what names mean), built by one
        walk per module version."""
        self._switch(module)
        if self._names is None:
            self._names = ScopeModel(module, self.watch, self.watch_types)
        return self._names

    def positions(self, module: cst.Module) -> Positions | LazyPositions:
        """Return the positions of the nodes of `module` (as `PositionProvider` gives them)."""
        self._switch(module)
        if self._positions is None:
            if self._code is not None and self._outline is not None:
                self._positions = LazyPositions(module, self._code, self._outline)
            else:
                self._positions = Positions(module)
        return self._positions


@dataclass(frozen=True)
class Home:
    """Where the file being migrated lives, as the engine found it: where shared modules go.

    `directory` is the folder of the code base's main package or the file's own package
    (`package`), or, for a script in no package, the file's own folder (`package` None: the module
    is imported by its bare name); empty for a notebook that imports no package of its code base,
    which keeps shared code in itself. `why` says why, for the site's message
    (`jaxmigrate.pipeline.project` has the rules).
    """

    directory: str
    package: str | None = None
    why: str = ""
    main: bool = False  # `package` is the main package of the file's code base


@dataclass(frozen=True)
class Outside:
    """How the other modules of a file's code base use one public function of it, for a pass
    (`Project.outside_uses` reads them): where one names it and where one reads its result,
    "" when none does. A module others may import from outside the code base (a package's) has
    every function called and read "from outside the code base"."""

    called: str = ""  # "in `main.py:60`"
    read: str = ""  # "in `imagenet.ipynb[cell 17]`", where its result is read


@dataclass(frozen=True)
class Callers:
    """How the other modules of a file's code base use its functions: `everywhere`, why every
    public function may be called and read from outside the code base (a package's module), and
    `uses` by function name (`"*"`: every function; a name absent: no other module uses it)."""

    everywhere: str = ""
    uses: Mapping[str, Outside] = field(default_factory=dict)

    def of(self, name: str) -> Outside:
        """Return how other modules use the function `name`."""
        if self.everywhere and not name.startswith("_"):  # `_name`: the module's own
            return Outside(self.everywhere, self.everywhere)
        own, every = self.uses.get(name) or Outside(), self.uses.get("*") or Outside()
        return Outside(own.called or every.called, own.read or every.read)


@dataclass
class FileState:
    """Per-file, per-run state the engine hands to every pass through the codemod context."""

    enabled: frozenset[str] | None = None
    target_jax: tuple[int, int] = LATEST_JAX
    target_source: str = ""  # where the target came from (`Options.target_source`)
    selected: frozenset[str] | None = None
    original_lines: Sequence[str] = ()
    line_map: Callable[[int], int] = lambda line: line
    sites: list[Site] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    changed: bool = False
    style: Style = field(default_factory=Style)  # how the file is written: new code follows it
    first_party: frozenset[str] = frozenset()  # top-level modules of the file's own project
    cache: ModuleCache = field(default_factory=ModuleCache)
    home: Home | None = None  # None: no project around the text (stdin, a notebook, a test)
    # Where the code base reads the legacy mesh context (`Project.legacy_mesh_reads`)
    mesh_reads: tuple[str, ...] = ()
    # How the code base's other modules use the module's functions; None: not known (a text
    # alone, `Project.outside_uses`)
    outside: Callers | None = None
    # The code base's modules the module imports, (dotted name, text), in import order
    # (`Project.imported_modules`); empty: none, or not known (a text alone)
    modules: tuple[tuple[str, str], ...] = ()
    pmap_style: str = "idiomatic"  # "faithful": pmap keeps its per-device form everywhere
    pmap_replicated: tuple[str, ...] = ()  # `Options.pmap_replicated`
    files: list[ProjectFile] = field(default_factory=list)
    # Forms to write in their fallback form (`Site.fallback` key -> why): verification found
    # them wrong. The program-level pmap form keyed `JM202:program:LINE:COL` -> faithful form.
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    _keys: dict[str, int] = field(default_factory=dict)

    def new_key(self, base: str) -> str:
        """Return a key unique within this file for a site located at `base`."""
        n = self._keys.get(base, 0)
        self._keys[base] = n + 1
        return base if n == 0 else f"{base}#{n}"

    def suppressed(self, line: int, code: str) -> bool:
        """Return True if the original line carries `# jaxmigrate: skip` for `code`."""
        if not 0 < line <= len(self.original_lines):
            return False
        match = SUPPRESS.search(self.original_lines[line - 1])
        if match is None:
            return False
        codes = match.group(1)
        return codes is None or code in {c.strip() for c in codes.split(",")}


_QUALNAME_PARTS: dict[type[Pass], tuple[tuple[str, ...], ...]] = {}


def version_text(version: tuple[int, int]) -> str:
    """Return `0.6` for `(0, 6)`."""
    return ".".join(map(str, version))


class Pass(CodemodCommand, cst.CSTTransformer):
    """A migration: one legacy pattern, rewritten; subclasses set the class attributes.

    A pass that declares `QUALNAMES` (or `NODE_TYPES`) only visits the nodes on the way to a use
    of one of them (or a node of one of those types); `PRUNE = False` visits everything. On a
    large file that is most of the cost saved.
    """

    NAME: ClassVar[str]
    CODE: ClassVar[str]
    SAFETY: ClassVar[Safety]
    # The oldest JAX (major, minor) every release of which has what the rewritten code uses: an
    # API new in a patch release (0.6.1) needs the next minor (0.7).
    MIN_JAX: ClassVar[tuple[int, int]] = (0, 4)
    # What the verifier runs instead of the original when the original raises on the installed
    # JAX (`verify/child/references.py`; cookbook, "Notes for the verifier"); None: only the
    # original.
    REFERENCE: ClassVar[str | None] = None
    # True: the pass reads `FileState.mesh_reads` (the engine then scans the code base once).
    READS_MESH: ClassVar[bool] = False
    # True: the pass reads `FileState.outside` (the engine then reads the module's callers).
    READS_CALLERS: ClassVar[bool] = False
    # True: the pass reads `FileState.modules` (the engine then reads the imported modules).
    READS_IMPORTS: ClassVar[bool] = False
    TRIGGER: ClassVar[re.Pattern[str]]
    # Plain strings one of which every match of TRIGGER contains: tested first with `in`, which
    # is some 50x faster than a regex that starts with `\b` (no literal prefix to search for).
    LITERALS: ClassVar[tuple[str, ...]] = ()
    QUALNAMES: ClassVar[tuple[str, ...]] = ()
    NODE_TYPES: ClassVar[tuple[type[cst.CSTNode], ...]] = ()
    PRUNE: ClassVar[bool] = True
    # (legacy, modern): the legacy API's name in the comments on a statement whose legacy call
    # the rewrite removed is replaced by the modern one's (see `_renamed_in_comments`).
    COMMENT_WORDS: ClassVar[tuple[str, str] | None] = None

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        state = context.scratch.get(STATE_KEY)
        if not isinstance(state, FileState):
            state = FileState()
            context.scratch[STATE_KEY] = state
        self.state: FileState = state
        self.names: ScopeModel | None = None
        self._input: cst.Module | None = None
        self._visit_only: frozenset[int] | None = None
        self.unused_candidates: set[str] = set()
        self.import_requests: list[ImportRequest] = []

    # Identity and documentation ------------------------------------------------------------
    @classmethod
    def summary(cls) -> str:
        """Return the first line of the pass's documentation."""
        return (cls.__doc__ or "").strip().splitlines()[0]

    @classmethod
    def may_apply_to(cls, facts: AstFacts) -> bool:
        """Return False when the file's `ast` shows it holds no site (prefilter, second stage).

        Called only when the module mentions one of `QUALNAMES` (if any are declared)."""
        return True

    @classmethod
    def mentioned_in(cls, facts: AstFacts) -> bool:
        """Return False when the file's `ast` references none of `QUALNAMES` (the prefilter's
        name stage; always True without them)."""
        return not cls.QUALNAMES or facts.mentions(cls.QUALNAMES)

    @classmethod
    def may_name(cls, source: str) -> bool:
        """Return False when `source` cannot mention any of `QUALNAMES` (always True without).

        The prefilter's name stage keeps a pass only for a module mentioning one of them
        (`AstFacts.mentions`): a dotted name built from its imports and attribute reads, every
        part of which is written in the source. So every part of one of them must be in the
        text, which plain `in` tests answer before anything is parsed."""
        parts = _QUALNAME_PARTS.get(cls)
        if parts is None:
            parts = _QUALNAME_PARTS[cls] = tuple(tuple(q.split(".")) for q in cls.QUALNAMES)
        return not parts or any(all(p in source for p in name) for name in parts)

    @classmethod
    def applies_to(cls, source: str) -> bool:
        """Return True if `source` may contain a site: the cheap text prefilter."""
        if cls.LITERALS and not any(literal in source for literal in cls.LITERALS):
            return False
        return cls.TRIGGER.search(source) is not None

    # Running ------------------------------------------------------------------------------
    def transform_module(self, tree: cst.Module) -> cst.Module:
        """Run the pass; a module with no candidate is returned as it is (the same object)."""
        if not self.state.cache.watch and not self.state.cache.watch_types:
            self.state.cache = ModuleCache(self.QUALNAMES, self.NODE_TYPES)
        names = self.state.cache.names(tree)
        watched = self.QUALNAMES or self.NODE_TYPES
        visit_only = names.paths_to(self.QUALNAMES, self.NODE_TYPES) if watched else None
        if visit_only is not None and not visit_only:
            return tree
        if not self.has_candidates(tree, names):
            return tree
        self.names, self._input = names, tree
        self._visit_only = visit_only if self.PRUNE else None
        if self.METADATA_DEPENDENCIES:
            wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
            with self.resolve(wrapper):
                out = self.transform_module_impl(tree)
        else:
            out = self.transform_module_impl(tree)
        return self._finish(out) if self.state.changed else tree

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Visit the module (the libcst codemod entry point)."""
        return tree.visit(self)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._visit_only is not None and id(node) not in self._visit_only:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        if self._visit_only is not None and id(original_node) not in self._visit_only:
            return updated_node
        left: Any = super().on_leave(original_node, updated_node)
        if isinstance(original_node, cst.SimpleStatementLine) and left is not original_node:
            if self.COMMENT_WORDS and isinstance(left, cst.SimpleStatementLine):
                left = self._renamed_in_comments(original_node, left)
            left = keep_trailing_comment(original_node, left)
        return left

    def _renamed_in_comments(
        self, original: cst.SimpleStatementLine, new: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        """Return `new` with the legacy API's name in the comments that describe it (the comment
        lines right above it and the one ending it) replaced by its successor's, when the
        statement's value was the legacy call and is something else now: "pmean only works
        inside pmap" above `cross_replica_mean = jax.pmap(...)`."""
        assert self.COMMENT_WORDS is not None
        legacy, modern = self.COMMENT_WORDS
        word = re.compile(rf"(?<![\w.]){legacy}(?!\w)|(?<=jax\.){legacy}(?!\w)")
        value = getattr(original.body[-1], "value", None) if original.body else None
        if not isinstance(value, cst.Call) or not re.fullmatch(
            rf"(\w+\.)*{legacy}", code(value.func)
        ):
            return new  # only a statement that is the legacy call (`f = jax.pmap(...)`)
        after = getattr(new.body[-1], "value", None) if new.body else None
        if after is None or re.search(rf"(?<![\w.]){legacy}\b|jax\.{legacy}\b", code(after)):
            return new
        lines = list(new.leading_lines)
        start = len(lines)
        while start and lines[start - 1].comment is not None:
            start -= 1
        changed = False
        for i in range(start, len(lines)):
            comment = lines[i].comment
            if comment is not None and word.search(comment.value):
                lines[i] = lines[i].with_changes(
                    comment=cst.Comment(word.sub(modern, comment.value))
                )
                changed = True
        trailing = new.trailing_whitespace
        if trailing.comment is not None and word.search(trailing.comment.value):
            text = word.sub(modern, trailing.comment.value)
            trailing = trailing.with_changes(comment=cst.Comment(text))
            changed = True
        if not changed:
            return new
        return new.with_changes(leading_lines=lines, trailing_whitespace=trailing)

    def get_metadata(self, key: Any, node: cst.CSTNode, default: Any = _UNSET) -> Any:
        """Positions are computed lazily, only once a pass asks for one."""
        if key is PositionProvider and self._input is not None:
            return self.state.cache.positions(self._input)[node]
        if default is _UNSET:
            return super().get_metadata(key, node)
        return super().get_metadata(key, node, default)

    def line_of(self, node: cst.CSTNode) -> str:
        """Return the line of the module being transformed that `node` (original) starts on."""
        assert self._input is not None
        lines = self.state.cache.lines(self._input)
        return lines[self.get_metadata(PositionProvider, node).start.line - 1]

    def room(self, node: cst.CSTNode) -> Room:
        """Return where `node` (original) is written: its line's indentation, its column and
        the width of what follows it on its last line."""
        assert self._input is not None
        where = self.get_metadata(PositionProvider, node)
        lines = self.state.cache.lines(self._input)
        last = lines[where.end.line - 1]
        return Room.of_line(
            lines[where.start.line - 1], where.start.column, len(last) - where.end.column
        )

    def fit(self, original: cst.Call, new: cst.Call, *, rearranged: bool = False) -> cst.Call:
        """Return `new`, which replaces `original`, laid out in the file's style."""
        return fit_call(original, new, self.room(original), self.state.style, rearranged=rearranged)

    def _finish(self, tree: cst.Module) -> cst.Module:
        tree = remove_unused_imports(tree, self.unused_candidates)
        if self.import_requests:
            tree = add_imports(tree, self.import_requests, self.state.first_party)
        return tree

    def has_candidates(self, tree: cst.Module, names: ScopeModel) -> bool:
        """Return False when the module surely holds no site; the default asks the pass."""
        return True

    @property
    def resolver(self) -> ScopeModel:
        """The scope model of the module being transformed (the same for every pass that
        leaves it unchanged): ask it what names mean and where they are bound."""
        assert self.names is not None, "names are resolved in transform_module"
        return self.names

    def qualname(self, node: cst.BaseExpression) -> str | None:
        """Return what `node` means (`jax.pmap`), or None."""
        return self.resolver.qualified_name(node)

    # Recording ----------------------------------------------------------------------------
    def where(self, node: cst.CSTNode) -> tuple[int, int]:
        """Return the original line and 1-based column of `node` (a node of the input)."""
        pos: CodeRange = self.get_metadata(PositionProvider, node)
        return self.state.line_map(pos.start.line), pos.start.column + 1

    def site(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        group: str | None = None,
        safety: Safety | None = None,
        min_jax: tuple[int, int] | None = None,
        requires: tuple[str, ...] = (),
        fallback: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> bool:
        """Record a site at `node`; return True if the pass should rewrite it now.

        `requires` names rules (codes) whose sites this one cannot do without (its group's other
        members): when one is not selected, the site is skipped with that reason. `fallback` is
        the key that asks this pass for the site's fallback form (`FileState.fallbacks`);
        `details` go to the report with the site (and to its verification).
        """
        line, col = self.where(node)
        if self.state.suppressed(line, self.CODE):
            self.state.skips.append(
                Skip(self.CODE, self.NAME, line, col, "suppressed by comment", suppressed=True)
            )
            return False
        need = max(self.MIN_JAX, min_jax or self.MIN_JAX)
        if self.state.target_jax < need:
            needs, target = version_text(need), version_text(self.state.target_jax)
            source = self.state.target_source
            reason = f"the rewrite needs JAX >= {needs}, the target is {target}"
            reason += f" ({source})" if source else ""
            held = Skip(self.CODE, self.NAME, line, col, reason)
            self.state.skips.append(
                replace(held, needs_jax=needs, target_jax=target, target_source=source)
            )
            return False
        missing = [
            c for c in requires if self.state.selected is not None and c not in self.state.selected
        ]
        if missing:
            reason = f"needs rule {', '.join(missing)} too, which is not selected"
            self.state.skips.append(Skip(self.CODE, self.NAME, line, col, reason))
            return False
        key = self.state.new_key(f"{self.CODE}:{line}:{col}")
        self.state.sites.append(
            Site(
                code=self.CODE,
                name=self.NAME,
                line=line,
                col=col,
                safety=safety or self.SAFETY,
                message=message,
                key=key,
                group=group,
                fallback=fallback,
                details=dict(details or {}),
            )
        )
        enabled = self.state.enabled is None or key in self.state.enabled
        if enabled:
            self.state.changed = True
        return enabled

    def skip(self, node: cst.CSTNode, reason: str) -> None:
        """Record that the construct at `node` is left alone on purpose, and why."""
        line, col = self.where(node)
        suppressed = self.state.suppressed(line, self.CODE)
        self.state.skips.append(
            Skip(
                self.CODE,
                self.NAME,
                line,
                col,
                "suppressed by comment" if suppressed else reason,
                suppressed=suppressed,
            )
        )

    # Emitting -----------------------------------------------------------------------------
    def shared_module(self, name: str, text: str, keys: Iterable[str]) -> str | None:
        """Request module `name` of the user's project, holding `text`; return its import name.

        The engine creates or updates the file with the run, when one of the sites `keys` is
        applied. None when the file has no project around it: the pass keeps the code in the file.
        """
        home = self.state.home
        if home is None or not home.directory:  # no project, or a notebook that imports none
            return None
        path = os.path.join(home.directory, f"{name}.py")
        self.state.files.append(ProjectFile(path, text, frozenset(keys)))
        module = f"{home.package}.{name}" if home.package else name
        # The code base's own module, even before it exists: imported among the first party.
        self.state.first_party = self.state.first_party | {module.split(".")[0]}
        return module

    def need_import(self, module: str, obj: str | None = None, asname: str | None = None) -> None:
        """Schedule `import module` / `from module import obj` at the top of the file."""
        request = (module, obj, asname)
        if request not in self.import_requests:
            self.import_requests.append(request)

    def drop_import_if_unused(self, local_name: str) -> None:
        """Remove the import binding `local_name` after the pass, if nothing reads it then."""
        self.unused_candidates.add(local_name)

    def module_ref(self, module: str) -> cst.BaseExpression:
        """Return an expression for `module` (`jax`, or the user's alias), importing it if needed.

        A module imported here under a name the file already uses for something else (a
        parameter `jax`, an unimported `functools`) gets a fresh alias (`functools_`): binding
        the name would change what that other code means.
        """
        local = self.resolver.module_alias(module)
        if local is None:
            local = module
            if self.resolver.is_unused(module.partition(".")[0]):
                self.need_import(module)
            else:
                local = module.replace(".", "_") + "_"
                while not self.resolver.is_free(local):
                    local += "_"
                self.need_import(module, None, local)
        return cst.parse_expression(local)

    def jax_attr(self, dotted_path: str) -> cst.BaseExpression:
        """Return `jax.<dotted_path>` spelled with the module's own alias for `jax`."""
        base = self.module_ref("jax")
        for part in dotted_path.split("."):
            base = cst.Attribute(value=base, attr=cst.Name(part))
        return base
