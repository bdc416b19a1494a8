"""The faithful form of a pmap: `jax.jit` of the `shard_map_per_device` helper, the body keeping
its per-device view; what each site becomes, and the helper written once per module or project."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import libcst as cst
import libcst.matchers as m

from jaxmigrate.toolkit.emit import (
    Call,
    Item,
    Style,
    code,
    fit_lines,
    is_plain_reusable,
    items_of,
    new_item,
)
from jaxmigrate.toolkit.imports import is_import_line
from jaxmigrate.toolkit.names import dotted
from jaxmigrate.toolkit.passes import Home

from ._declines import NotVisible
from ._forms import base_of
from ._layout import fill, holes_of
from ._passon import elsewhere
from ._program import numbered
from ._reach import assigned_name, nodes_in
from ._specs import (
    TAIL_BUILTINS,
    NotMigrated,
    Pmapped,
    SpecMaker,
    Untranslatable,
    mapped_name,
    partition_spec,
    read_pmap,
    spec_tree,
    statics,
    tail_fits,
    tuple_of,
    unbound,
    with_static_tail,
    with_statics,
)
from ._survey import (
    HELPER,
    HELPER_DOC,
    PARTIAL,
    Finding,
    PmapUse,
)

PARTITION_SPEC = "jax.sharding.PartitionSpec"
UNNAMED = "device"  # the name of an unnamed mapped axis, unless the module uses it
STATIC_MIN_JAX = (0, 8)  # `in_specs` entries `None` (static arguments): JAX 0.7.1
MESSAGE = "`jax.pmap` -> `jax.jit` of `shard_map_per_device`, the body keeping its per-device view"

# Written one statement per line, 4-space indented: `emit.fit_lines` breaks the lines too long
# for the file's width, after the indentation is the file's own.
HELPER_SOURCE = '''\
def shard_map_per_device(f, *, axis_name, in_specs, out_specs, devices=None, backend=None, **jit_options):
    """{doc}"""
    import weakref

    # As pmap's cache: the same `f` and options, the same jitted function
    # (a pmap made in the function that calls it compiles once, not per call).
    options = (axis_name, in_specs, out_specs, backend)
    options += (devices and tuple(devices), *sorted(jit_options.items()))
    made = vars(shard_map_per_device).setdefault("made", weakref.WeakKeyDictionary())
    try:
        return made[f][options]
    except (KeyError, TypeError):  # TypeError: an `f` or options that cannot be keys
        pass
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    specs = (in_specs, {P}(*names))  # pmap maps keyword arguments over their leading axis

    def at_mapped_axes(specs, tree, fn):  # fn(leaf, axes) on each leaf its spec maps
        def under(spec, subtree):
            axes = tuple(tuple(spec).index(n) for n in names if n in (spec or ()))
            return {jax}.tree.map(lambda x: fn(x, axes), subtree) if axes else subtree

        return {jax}.tree.map(under, specs, tree, is_leaf=lambda s: s is None)

    def per_device(args, kwargs):
        args, kwargs = at_mapped_axes(specs, (args, kwargs), {jax}.lax.squeeze)
        return at_mapped_axes(out_specs, f(*args, **kwargs), {jax}.lax.expand_dims)

    def mesh_of(args, kwargs, processes):  # pmap's: the first devices, by process
        sizes = []
        at_mapped_axes(specs, (args, kwargs), lambda x, ax: sizes.append([x.shape[a] for a in ax]))
        shape = [sizes[0][0] * processes, *sizes[0][1:]]
        pool = {jax}.devices(backend) if devices is None else devices
        pool = sorted(pool, key=lambda d: d.process_index)
        return {jax}.sharding.Mesh({np}.reshape(pool[: {np}.prod(shape)], shape), names)

    def on_devices(*args, **kwargs):  # runs when jax.jit traces: devices are found then
        mesh = mesh_of(args, kwargs, 1)
        # check_vma=False as in pmap: True would sum the gradients of replicated values
        return {jax}.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(args, kwargs)

    jitted = {jax}.jit(on_devices, **jit_options)

    def call(*args, **kwargs):
        processes = {jax}.process_count(backend)
        if processes == 1:
            return jitted(*args, **kwargs)
        # As pmap: each process passes its own devices' slices, and gets its own back.
        from jax.experimental import multihost_utils as hosts

        def to_global(spec, tree):  # Python scalars stay: jax.jit takes them as given
            def put(x):
                return hosts.host_local_array_to_global_array(x, mesh, spec)

            return {jax}.tree.map(lambda x: put(x) if hasattr(x, "shape") else x, tree)

        mesh = mesh_of(args, kwargs, processes)
        args, kwargs = {jax}.tree.map(lambda s, t: t if s is None else to_global(s, t), specs, (args, kwargs), is_leaf=lambda s: s is None)
        out = jitted(*args, **kwargs)
        return hosts.global_array_to_host_local_array(out, mesh, out_specs)

    try:
        made.setdefault(f, {{}})[options] = call
    except TypeError:
        pass
    return call
'''


SHARED_MODULE = "_pmap_compat"
SHARED_DOC = """\
`shard_map_per_device` (written by jaxmigrate, JM202): `jax.pmap` as `jax.jit` of `shard_map`.

{where}
`jaxmigrate explain JM202` says what the helper does and why.
"""
IN_PACKAGE = """\
The modules whose `jax.pmap` jaxmigrate rewrote import the helper from here: one module per code
base, in its main package (the package named after the distribution, else its only library
package, else its largest). Files outside the package that import it, or a package beside it,
import it from here too."""
IN_OWN = """\
The modules of this package whose `jax.pmap` jaxmigrate rewrote import the helper from here (it
is not the main package of its code base, and they cannot be sure to import that one)."""
BESIDE = """\
The scripts beside this module whose `jax.pmap` jaxmigrate rewrote import the helper from here:
they import no package of their code base, and their folder is first on `sys.path` when they
run (`python script.py`, pytest), so the helper sits beside them."""


def helper_text(style: Style | None = None) -> str:
    """The helper's text in canonical spelling (`jax`, `np`, `P`), in `style`."""
    style = style or Style()
    return fit_lines(
        style.reindent(HELPER_SOURCE.format(doc=HELPER_DOC, jax="jax", np="np", P="P")), style
    )


def shared_source(home: Home | None = None, style: Style | None = None) -> str:
    """Return the text of the project module holding the helper, in canonical spelling and in
    `style` (the code base's indentation and line length): the docstring says why the module is
    where it is (the main package, a package, beside scripts)."""
    style = style or Style()
    imports = "import jax\nimport numpy as np\nfrom jax.sharding import PartitionSpec as P\n"
    where = IN_PACKAGE if home is None or home.main else IN_OWN if home.package else BESIDE
    doc = "\n\n".join(
        textwrap.fill(" ".join(part.split()), style.width - 4, break_on_hyphens=False)
        for part in SHARED_DOC.format(where=where).split("\n\n")
    )
    return f'"""{doc}\n"""\n\n{imports}\n\n{helper_text(style)}'


@dataclass
class Rewrite:
    """What one site becomes: the helper's arguments and `jax.jit`'s, with notes for the report."""

    fun: Item | None
    helper: list[Item]
    jit: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    min_jax: tuple[int, int] | None = None


Layers = list[tuple[Pmapped, list[Item]]]


def arity(node: cst.CSTNode | None, statics: Sequence[int] = ()) -> int | None:
    """Return how many positional arguments a visible def takes, when that number is fixed:
    no defaults, or none after the last of `statics` (pmap raises unless a call passes every
    static argument by position, so a default up to there is always overridden)."""
    if not isinstance(node, cst.FunctionDef) or isinstance(node.params.star_arg, cst.Param):
        return None
    positional = (*node.params.posonly_params, *node.params.params)
    passed = max(statics, default=-1) + 1  # at least this many, by position
    return len(positional) if all(p.default is None for p in positional[passed:]) else None


def arity_of_calls(scope: cst.CSTNode, name: cst.Name, method: bool) -> tuple[int, set[str]] | None:
    """Return how many positional arguments every call of `name` (a def's, or a step's bound
    by `name = jax.pmap(...)`) in `scope` passes (a method's `self`, called as `obj.fn(...)`,
    counted) and the keywords they pass, when each other reference to it is such a call and
    all pass that number by position; else None.

    For a def with a default after its last static argument (AlgoPerf's wmt
    `predict_step(self, ..., max_decode_len, beam_size=4)`), or one called with keyword
    arguments: pmap maps each argument a call passes, so the faithful form has a spec for each
    positional one. A call in another module passing another number fails loudly, its
    arguments not matching the specs."""
    named = m.Attribute(attr=m.Name(name.value)) if method else m.Name(name.value)
    counts, keywords, called, others = set(), set[str](), set(), []
    for node in nodes_in(scope, cst.CSTNode):  # type: ignore[type-abstract]
        if isinstance(node, cst.Call) and m.matches(node.func, named):
            if any(a.star for a in node.args):
                return None
            keywords.update(a.keyword.value for a in node.args if a.keyword)
            counts.add(sum(a.keyword is None for a in node.args) + method)
            called.add(id(node.func))
        elif m.matches(node, named) and node is not name and id(node) not in called:
            others.append(node)
    return (counts.pop(), keywords) if len(counts) == 1 and not others else None


def after_imports(body: Sequence[cst.BaseStatement], default: int) -> int:
    """Return the index after the last import statement of `body`, else `default`."""
    imports = [i for i, statement in enumerate(body) if is_import_line(statement)]
    return imports[-1] + 1 if imports else default


def with_helper(module: cst.Module, source: str, style: Style, at: int) -> cst.Module:
    """Return `module` with the def `source` (laid out in its style) at `at` of its body, two
    blank lines above it and at least two below."""
    source = fit_lines(style.reindent(source), style)
    helper = cst.parse_statement(source, config=module.config_for_parsing)
    body = list(module.body)
    body.insert(at, helper.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    if at + 1 < len(body):
        leading = list(body[at + 1].leading_lines)
        blank = next((i for i, line in enumerate(leading) if line.comment), len(leading))
        missing = [cst.EmptyLine()] * max(0, 2 - blank)
        body[at + 1] = body[at + 1].with_changes(leading_lines=missing + leading)
    return module.with_changes(body=body)


def _given_as(items: list[Item], at: int | None, keyword: str, value: cst.BaseExpression) -> Item:
    """`keyword=value`: in place of the argument at `at` (its comments kept), else new."""
    return new_item(keyword, value) if at is None else items[at].keyword(keyword, value)


class Faithful(Finding):
    """The pmap pass's faithful form: planning a site, and emitting it and the helper."""

    # Planning -----------------------------------------------------------------------------
    def _layers(self, site: PmapUse, updated: Sequence[cst.CSTNode]) -> Layers:
        """Return each pmap of a site (outer first), read, with its arguments as updated."""
        layers: Layers = []
        for original, new in zip(site.pmaps, updated):
            if isinstance(original, cst.Call) and isinstance(new, cst.Call):
                layers.append((read_pmap(original.args, has_fun=True), items_of(new)))
            elif isinstance(original, cst.Decorator) and isinstance(original.decorator, cst.Call):
                assert isinstance(new, cst.Decorator) and isinstance(new.decorator, cst.Call)
                pmapped = read_pmap(original.decorator.args[1:], has_fun=False)
                layers.append((pmapped, items_of(new.decorator)[1:]))
            else:
                layers.append((Pmapped(None, None, {}), []))
        return layers

    def _plan(self, site: PmapUse, layers: Layers) -> Rewrite:
        """Return what the site becomes; raise NotMigrated for what is not translated."""
        (outer, items), notes = layers[0], list[str]()
        names = self._axis_names(layers, notes)
        if len(layers) > 1:
            self._check_nested(layers)
        make = functools.partial(partition_spec, self._spec(), names)
        in_specs = self._specs(outer, items, "in_axes", make)
        out_specs = self._specs(outer, items, "out_axes", make)
        statics, tail = self._statics(outer, items)
        innermost, innermost_items = layers[-1]
        fun = innermost_items[innermost.fun] if innermost.fun is not None else None
        if tail is not None:
            in_specs = self._tail_specs(site, in_specs, *tail)
        elif statics:
            count = arity(site.mapped, statics)
            if count is None and fun is not None:
                count = self._partial_arity(fun.arg.value, statics)
            # a tuple of specs has one per argument already
            tupled = isinstance(in_specs, cst.Tuple)
            if (called := None if tupled else self._calls_arity(site, statics, count)) is not None:
                count = called
                notes.append(
                    f"`in_specs` is sized for the {count} arguments its calls in this module "
                    "pass (a call elsewhere passing another number raises)"
                )
            in_specs = with_statics(in_specs, statics, count)
        name = names[0] if len(names) == 1 else tuple_of(names)
        helper = [
            _given_as(items, outer.axis_name, "axis_name", name),
            _given_as(items, outer.options.get("in_axes"), "in_specs", in_specs),
            _given_as(items, outer.options.get("out_axes"), "out_specs", out_specs),
        ]
        if site.failed_program is not None:
            notes.append(site.fallback)
        elif site.fallback:
            notes.append(f"program-level form not taken: {site.fallback}")
        if unread := self._read_nowhere(site):
            notes.append(f"`{unread}`, around it, is read nowhere in the code base")
        home = self.state.home
        if home is not None and not self.reuse_helper and not home.directory:
            notes.append(f"the helper is defined in a cell: {home.why}")
        elif home is not None and not self.reuse_helper:  # say where the shared helper is
            module = f"{home.package}.{SHARED_MODULE}" if home.package else SHARED_MODULE
            notes.append(f"the helper is imported from `{module}`: {home.why}".rstrip(": "))
        static = bool(statics) or tail is not None
        plan = Rewrite(fun, helper, notes=notes, min_jax=STATIC_MIN_JAX if static else None)
        for keyword, i in outer.options.items():
            if keyword in ("devices", "backend"):
                plan.helper.append(items[i])
            elif keyword == "donate_argnums" or (keyword.startswith("static_") and static):
                plan.jit.append(items[i].keyword(keyword.replace("_broadcasted", "")))
            elif keyword == "axis_size":
                notes.append("`axis_size=` dropped: in one process it only checks the mapped size")
        return plan

    def _read_nowhere(self, site: PmapUse) -> str:
        """The name of the module-level def holding `site` when nothing reads it: not the module,
        no other file of the code base, no string (flax lm1b's `per_host_sum_pmap`); "" else.
        The rule keeps code that was unread before it came; the message says so."""
        name = site.statement.name.value if isinstance(site.statement, cst.FunctionDef) else ""
        if not name or name.startswith("__") or self.state.outside is None:
            return ""
        return "" if self._used_elsewhere(name) or self.module_flow.loads.get(name) else name

    def _axis_names(self, layers: Layers, notes: list[str]) -> list[cst.BaseExpression]:
        """Return the axis name of each pmap, naming the unnamed ones."""
        names: list[cst.BaseExpression] = []
        taken = set(self.survey.strings)
        for pmapped, items in layers:
            value = items[pmapped.axis_name].arg.value if pmapped.axis_name is not None else None
            if value is None or (isinstance(value, cst.Name) and value.value == "None"):
                fresh = numbered(UNNAMED, lambda n: n not in taken)
                taken.add(fresh)
                notes.append(f'the unnamed mapped axis is called "{fresh}"')
                value = self.state.style.string(fresh)
            elif isinstance(value, cst.Tuple):
                raise NotMigrated(
                    "a tuple `axis_name`: shard_map would read it as several mesh axes"
                )
            elif not is_plain_reusable(value):
                raise NotMigrated("a computed `axis_name`: the rewrite would evaluate it twice")
            names.append(value)
        return names

    def _check_nested(self, layers: Layers) -> None:
        for depth, (pmapped, items) in enumerate(layers):
            allowed = {"in_axes", "out_axes", *(("donate_argnums",) if depth == 0 else ())}
            if extra := sorted(set(pmapped.options) - allowed):
                raise NotMigrated(f"nested pmap with `{extra[0]}=`: only axis names are translated")
            for keyword in ("in_axes", "out_axes"):
                index = pmapped.options.get(keyword)
                if index is not None and holes_of("0", items[index].arg.value) is None:
                    raise NotMigrated(f"nested pmap with `{keyword}=` other than 0")

    def _specs(
        self, pmapped: Pmapped, items: list[Item], keyword: str, make: SpecMaker
    ) -> cst.BaseExpression:
        """Return the specs for `in_axes`/`out_axes` (0, pmap's default, when not given)."""
        if keyword not in pmapped.options:
            return make(0)
        value = items[pmapped.options[keyword]].arg.value
        if keyword == "in_axes" and isinstance(value, (cst.List, cst.Dict)):
            raise NotMigrated("a list or dict as `in_axes`: pmap rejects it (it wants a tuple)")
        try:
            return spec_tree(value, make)
        except Untranslatable as why:
            raise NotMigrated(f"`{keyword}`: {why}") from None

    def _statics(
        self, pmapped: Pmapped, items: list[Item]
    ) -> tuple[tuple[int, ...], tuple[int, cst.BaseExpression] | None]:
        """Return the static positions, or (as second) a tail `(k, n)` (`static_tail`)."""
        if "static_broadcasted_argnums" not in pmapped.options:
            return (), None
        value = items[pmapped.options["static_broadcasted_argnums"]].arg.value
        rebound = any(self.resolver.bound(name) for name in TAIL_BUILTINS)
        try:
            return statics(value, tail=not rebound)
        except Untranslatable as why:
            raise NotMigrated(f"`static_broadcasted_argnums`: {why}") from None

    def _tail_specs(
        self, site: PmapUse, specs: cst.BaseExpression, start: int, count: cst.BaseExpression
    ) -> cst.BaseExpression:
        """The specs of a def `f(a, b, *args)` whose star arguments are all static."""
        if not isinstance(site.mapped, cst.FunctionDef) or not tail_fits(site.mapped.params, start):
            named = f"{start} parameter{'s' * (start != 1)}"
            raise NotMigrated(
                f"`static_broadcasted_argnums` from {start} on: the mapped function is not "
                f"visibly a def taking `*args` after {named} without defaults"
            )
        try:
            return with_static_tail(specs, start, count)
        except Untranslatable as why:
            raise NotMigrated(f"`static_broadcasted_argnums`: {why}") from None

    def _spec(self, imported: bool = False) -> cst.BaseExpression:
        """Return how to spell `PartitionSpec` here; `imported`: ask for the import it needs."""
        # a binding at module level no function rebinds
        if (local := self.resolver.module_binding(PARTITION_SPEC)) is not None:
            return cst.Name(local)
        for name, asname in (("P", "P"), ("PartitionSpec", None)):
            if self.resolver.is_free(name):
                if imported:
                    self.need_import("jax.sharding", "PartitionSpec", asname)
                return cst.Name(name)
        jax = cst.Name(self.resolver.module_alias("jax") or "jax")
        return fill("{jax}.sharding.PartitionSpec", {"jax": jax})

    # Emitting ----------------------------------------------------------------------------
    def _planned(self, site: PmapUse, updated: Sequence[cst.CSTNode]) -> Rewrite | None:
        """Return the plan of a site to rewrite now, once recorded; None to leave it."""
        try:
            plan = self._plan(site, self._layers(site, updated))
        except (NotMigrated, Untranslatable) as why:
            self.skip(site.node, str(why))
            return None
        message = "; ".join([MESSAGE, *plan.notes])
        if not self.site(site.node, message, min_jax=plan.min_jax, fallback=site.failed_program):
            return None
        self._applied(site)
        return plan

    def _applied(self, site: PmapUse) -> None:
        """Record `site` as rewritten (the first one imports `PartitionSpec`), and drop the
        import that spelled `pmap` (`pmap`, or the `jax` of `jax.pmap`) if the rewritten module
        no longer reads it: the shared helper needs no `jax` in the file."""
        self.applied.append(site)
        self.applied_keys.append(self.state.sites[-1].key)
        if len(self.applied) == 1:
            self._spec(imported=True)
        if isinstance(ref := base_of(site.ref), cst.Name):
            self.drop_import_if_unused(ref.value)

    def _value(self, site: PmapUse, updated: cst.BaseExpression) -> cst.BaseExpression:
        """`jax.pmap` kept as a value whose calls give only `f` and `axis_name="a"`:
        `functools.partial(shard_map_per_device, in_specs=P("a"), out_specs=P("a"))`, so each
        call `t(f, axis_name="a")` is the faithful form of `jax.pmap(f, axis_name="a")`."""
        assert site.value_axis is not None
        axis = code(site.value_axis)
        message = (
            f"`jax.pmap` kept as a value, called in its function only with `axis_name={axis}` -> "
            f"`{HELPER}` partially applied, pmap's mapping of every argument and result"
        )
        if not self.site(site.node, message):
            return updated
        self._applied(site)
        template = "{partial}({helper}, in_specs={spec}({axis}), out_specs={spec}({axis}))"
        holes = {"partial": self._partial(site), "helper": cst.Name(HELPER)}
        value = fill(template, {**holes, "spec": self._spec(), "axis": site.value_axis})
        assert isinstance(value, cst.Call)
        return self._laid_out(Call.of(value), site.node, updated)

    def _laid_out(self, call: Call, node: cst.CSTNode, old: cst.BaseExpression) -> cst.Call:
        """Return `call` laid out where `node` is, in the parentheses `old` had."""
        laid = call.laid_out(self.room(node), self.state.style)
        return laid.with_changes(lpar=old.lpar, rpar=old.rpar)

    def _decorators(self, site: PmapUse, plan: Rewrite, new: cst.Decorator) -> list[cst.Decorator]:
        """Return `@partial(shard_map_per_device, ...)`, `jax.jit`'s arguments last."""
        partial = self._partial(site)
        room = self.room(site.node)
        room = replace(room, column=room.column + 1, tail=0)  # after the `@`
        helper = Call(partial, [Item(cst.Arg(cst.Name(HELPER))), *plan.helper, *plan.jit])
        return [new.with_changes(decorator=helper.laid_out(room, self.state.style))]

    def _calls_arity(self, site: PmapUse, statics: Sequence[int], known: int | None) -> int | None:
        """The arity a decorated def's calls in the module agree on (`arity_of_calls`), when
        `known`, the def's own, is not it: unknown (a default after the last static argument),
        or more than the calls pass by position, the rest by keyword (pmap maps keyword
        arguments, so `in_specs` is per position: sized by the def, a call passing `x=` fails).
        The calls must pass every static argument, and fill every parameter without a default.
        Or, the function mapped being no def of the module, the arity of `step = jax.pmap(...)`,
        a statement of a function read only by calls there passing every argument by position
        (scenic's `jax.pmap(train_step, static_broadcasted_argnums=(2,))` of a made
        `train_step`)."""
        fn, assign = site.mapped, site.ancestors[-2] if len(site.ancestors) > 1 else None
        positional: tuple[cst.Param, ...] | None = None  # a step's: not known
        if isinstance(site.node, cst.Call):
            if known is not None or assigned_name(assign) is None:
                return None
            target = cst.ensure_type(assign, cst.Assign).targets[0].target
            scope, name, method = site.around, cst.ensure_type(target, cst.Name), False
            if not isinstance(scope, cst.FunctionDef):
                return None
        elif isinstance(fn, cst.FunctionDef) and not isinstance(fn.params.star_arg, cst.Param):
            method = any(isinstance(a, cst.ClassDef) and fn in a.body.body for a in site.ancestors)
            if not method and elsewhere(fn.name.value, self.state.outside, self.survey.strings):
                return None  # called by other modules too: how many arguments they pass is not seen
            scope, name = site.ancestors[0], fn.name
            positional = (*fn.params.posonly_params, *fn.params.params)
        else:
            return None
        count, keywords = arity_of_calls(scope, name, method) or (0, set[str]())
        if positional is None:
            return count if count > max(statics) and not keywords else None
        filled = all(
            p.default or i < count or p.name.value in keywords for i, p in enumerate(positional)
        )
        fits = count != known and max(statics) < count <= len(positional)
        return count if filled and fits else None

    def _partial_arity(self, fun: cst.BaseExpression, statics: Sequence[int]) -> int | None:
        """The positional arity of `functools.partial(f, k=v, ...)`, `f` a def of the module:
        the parameters before the first one bound by keyword (a position cannot reach later)."""
        try:
            name, bound = mapped_name(fun, self.qualname)
            defs = self.survey.defs(name) if name and bound else []
            if len(defs) != 1 or self.survey.rebound(name):
                return None
            params = defs[0].params
            if params.posonly_params or isinstance(params.star_arg, cst.Param):
                return None
            return arity(unbound(defs[0], bound), statics)
        except NotVisible:  # not a def, or `partial` binds no parameter of it
            return None

    def _partial(self, site: PmapUse) -> cst.BaseExpression:
        """Return `functools.partial` as the site or the module spells it."""
        for deco in site.pmaps:
            if isinstance(deco, cst.Decorator) and isinstance(deco.decorator, cst.Call):
                return deco.decorator.func.deep_clone()
        if (local := self.resolver.module_binding(PARTIAL)) is not None:
            return cst.Name(local)
        return cst.Attribute(value=self.module_ref("functools"), attr=cst.Name("partial"))

    # The helper ---------------------------------------------------------------------------
    def _numpy(self) -> str:
        """Return how to spell `numpy` here, importing it as `np` if needed."""
        return self._spelled(self.resolver.module_alias("numpy"), "numpy", "np")

    def _spelled(self, bound: str | None, module: str, local: str, obj: str | None = None) -> str:
        """Return `bound`, the module's own name for `module` (or its `obj`); else `local`,
        imported as that when the module uses the name nowhere; else the name spelled out."""
        if bound is not None:
            return bound
        if self.resolver.is_free(local):
            self.need_import(module, obj, None if local == obj else local)
            return local
        full = f"{module}.{obj}" if obj else module
        return dotted(self.module_ref(full)) or full

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.applied or self.reuse_helper:
            return updated_node
        text = shared_source(self.state.home, self.state.style)
        # one helper for the whole project, imported where needed
        if (shared := self.shared_module(SHARED_MODULE, text, self.applied_keys)) is not None:
            self.need_import(shared, HELPER)
            return updated_node
        jax = dotted(self.module_ref("jax")) or "jax"
        np = self._numpy()
        source = HELPER_SOURCE.format(doc=HELPER_DOC, jax=jax, np=np, P=code(self._spec()))
        first = min(original_node.body.index(s.statement) for s in self.applied)  # type: ignore[arg-type]
        at = after_imports(original_node.body[:first], first)  # above the first rewritten site
        return with_helper(updated_node, source, self.state.style, at)
