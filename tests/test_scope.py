"""The scope model (`jaxmigrate.toolkit.scope`) on every binding form Python has.

Each test parses real code with libcst and asks the model about the Name nodes of that module,
found by spelling and position (`_name(model_src, "x", 2)` is the third `x`).
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.toolkit.names import walk
from jaxmigrate.toolkit.passes import ModuleCache
from jaxmigrate.toolkit.scope import BindingKind, ScopeModel

K = BindingKind


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)


class Mod:
    """A parsed module, its scope model, and its Name nodes in source order."""

    def __init__(self, source: str) -> None:
        self.module = cst.parse_module(textwrap.dedent(source))
        self.model = ScopeModel(self.module, watch=("jax.pmap",))
        collector = _Names()
        self.module.visit(collector)  # libcst's own walk: every Name, def and param names too
        self.names = collector.found

    def name(self, spelling: str, nth: int = 0) -> cst.Name:
        return [n for n in self.names if n.value == spelling][nth]

    def means(self, spelling: str, nth: int = 0) -> str | None:
        return self.model.qualified_name(self.name(spelling, nth))

    def attr(self, dotted_text: str, nth: int = 0) -> str | None:
        """What the nth `a.b.c` Attribute chain spelled `dotted_text` means."""
        found: list[cst.Attribute] = []

        class _Attrs(cst.CSTVisitor):
            def visit_Attribute(self, node: cst.Attribute) -> None:
                if cst.Module([]).code_for_node(node) == dotted_text:
                    found.append(node)

        walk(_Attrs(), self.module)
        return self.model.qualified_name(found[nth])

    def kinds(self, spelling: str) -> list[BindingKind]:
        return [b.kind for b in self.model.bindings(spelling)]

    def scope_kind(self, spelling: str, nth: int = 0) -> str:
        return self.model.scope_of(self.name(spelling, nth)).kind


# Imports ----------------------------------------------------------------------------------------
def test_import_dotted_binds_its_first_name() -> None:
    m = Mod("import a.b.c\na.b.c.d\n")
    assert [(b.kind, b.qualname) for b in m.model.bindings("a")] == [(K.IMPORT, "a")]
    assert m.model.bindings("b") == ()
    assert m.attr("a.b.c.d") == "a.b.c.d"


def test_import_as_and_from_import_as() -> None:
    m = Mod("import jax.numpy as jnp\nfrom jax import pmap as pm\njnp\npm\n")
    assert m.means("jnp", 1) == "jax.numpy"
    assert m.means("pm", 1) == "jax.pmap"
    assert m.model.module_alias("jax.numpy") == "jnp"
    assert m.model.module_binding("jax.pmap") == "pm"


def test_relative_import_binds_a_name_that_means_nothing_known() -> None:
    m = Mod("from . import pmap\nfrom .x import y\npmap\ny\n")
    assert [(b.kind, b.qualname) for b in m.model.bindings("pmap")] == [(K.IMPORT, None)]
    assert m.means("pmap", 1) is None
    assert m.means("y", 1) is None
    assert m.model.bound("y")


def test_conditional_imports_that_conflict_resolve_to_nothing() -> None:
    m = Mod(
        """
        if new:
            from jax import shard_map
        else:
            from jax.experimental.shard_map import shard_map
        shard_map
        try:
            from jax import pmap
        except ImportError:
            from jax import pmap
        pmap
        """
    )
    assert m.kinds("shard_map") == [K.IMPORT, K.IMPORT]
    assert m.means("shard_map", 2) is None
    assert m.means("pmap", 2) == "jax.pmap"  # two bindings, one meaning


def test_try_except_fallback_and_except_name() -> None:
    m = Mod(
        """
        try:
            import jax.numpy as jnp
        except ImportError as err:
            jnp = None
            print(err)
        jnp
        """
    )
    assert m.kinds("jnp") == [K.IMPORT, K.ASSIGN]
    assert m.means("jnp", 2) is None
    assert m.kinds("err") == [K.EXCEPT]
    assert not m.model.is_read(m.name("err", 0))
    assert m.model.is_read(m.name("err", 1))


def test_star_import_may_bind_anything() -> None:
    m = Mod("from jax import *\nmesh = make()\nmesh\n")
    assert m.model.star_import
    assert m.model.bound("anything")
    assert m.model.assignment_seen_from("mesh", m.model.scope_of(m.name("mesh", 1))) is None
    assert not Mod("import jax\n").model.star_import


# Assignments ------------------------------------------------------------------------------------
def test_alias_chains_resolve_across_scopes() -> None:
    m = Mod(
        """
        import jax
        pm = jax.pmap
        def f():
            p = pm
            return p
        a = b = jax
        a
        """
    )
    assert m.means("p", 1) == "jax.pmap"
    assert m.model.module_binding("jax.pmap") == "pm"
    assert m.kinds("a") == [K.ASSIGN] and not m.model.bindings("a")[0].plain
    assert m.means("a", 1) is None  # a chained assignment is no alias


def test_assignment_seen_from_and_values() -> None:
    m = Mod(
        """
        mesh = Mesh(devices, ("x",))
        def f():
            return mesh
        def g():
            mesh = other()
            return mesh
        """
    )
    seen = m.model.assignment_seen_from("mesh", m.model.scope_of(m.name("mesh", 1)))
    assert seen is not None and cst.Module([]).code_for_node(seen.value) == 'Mesh(devices, ("x",))'
    inner = m.model.assignment_seen_from("mesh", m.model.scope_of(m.name("mesh", 3)))
    assert inner is not None and inner.scope.kind == "function"
    assert len(m.model.values("mesh")) == 2
    assert m.model.bound_below_module("mesh")


def test_annotation_without_value_makes_the_name_local_and_assigns_nothing() -> None:
    m = Mod(
        """
        import jax
        jax: object
        jax.pmap
        def f():
            jax: object
            return jax.pmap
        mesh: Mesh
        mesh = Mesh(d, ("x",))
        mesh
        """
    )
    binding = m.model.bindings("jax")[1]
    assert (binding.kind, binding.value, binding.assigns) == (K.ANNOTATED, None, False)
    assert m.attr("jax.pmap", 0) == "jax.pmap"  # at module level the import is the only value
    assert m.attr("jax.pmap", 1) is None  # in f, `jax` is local and unassigned
    assert m.model.bound_below_module("jax")
    seen = m.model.assignment_seen_from("mesh", m.model.scope_of(m.name("mesh", 2)))
    assert seen is not None and seen.plain


def test_annotation_with_value_binds_the_value_but_is_no_plain_assignment() -> None:
    m = Mod("import jax\npm: object = jax.pmap\npm\n")
    (binding,) = m.model.bindings("pm")
    assert binding.kind is K.ANNOTATED and binding.assigns and binding.value is not None
    assert not binding.plain
    assert m.model.assignment_seen_from("pm", m.model.module_scope) is None


def test_augmented_assignment_binds_and_reads() -> None:
    m = Mod("total = 0\ntotal += 1\n")
    assert m.kinds("total") == [K.ASSIGN, K.AUGMENTED]
    assert not m.model.is_read(m.name("total", 0))
    assert m.model.is_read(m.name("total", 1))


def test_unpacking_for_and_with_targets() -> None:
    m = Mod(
        """
        a, (b, *c) = value
        for i, j in pairs:
            pass
        with open(p) as f, lock as (x, y):
            pass
        """
    )
    assert [m.kinds(n) for n in "abc"] == [[K.TARGET]] * 3
    assert m.kinds("i") == m.kinds("j") == [K.FOR]
    assert m.kinds("f") == m.kinds("x") == m.kinds("y") == [K.WITH]
    assert not any(m.model.is_read(m.name(n)) for n in "abcijfxy")
    assert m.model.is_read(m.name("value")) and m.model.is_read(m.name("lock"))


def test_del_is_a_binding_that_leaves_the_name_unknown() -> None:
    m = Mod("import jax\ndel jax\njax.pmap\n")
    assert m.kinds("jax") == [K.IMPORT, K.DEL]
    assert m.attr("jax.pmap") is None


# Walrus and comprehensions ----------------------------------------------------------------------
def test_walrus_binds_where_it_stands() -> None:
    m = Mod("import jax\nif (pm := jax.pmap) is not None:\n    pm\n")
    (binding,) = m.model.bindings("pm")
    assert binding.kind is K.WALRUS and binding.scope.kind == "module"
    assert binding.value is not None


def test_walrus_in_a_comprehension_binds_in_the_enclosing_function() -> None:
    m = Mod(
        """
        def f(xs):
            found = [(last := x) for x in xs]
            return last
        """
    )
    (last,) = m.model.bindings("last")
    assert last.scope.kind == "function"
    (x,) = m.model.bindings("x")
    assert (x.kind, x.scope.kind) == (K.COMPREHENSION, "comprehension")
    assert m.scope_kind("last", 1) == "function"
    assert m.model.lookup("last", m.model.scope_of(m.name("last", 1))) is last.scope


def test_comprehension_has_its_own_scope_and_its_first_iterable_is_read_outside() -> None:
    m = Mod(
        """
        x = [1, 2]
        y = [x for x in x if x for z in x]
        {k: v for k, v in items}
        (g for g in gs)
        {s for s in ss}
        """
    )
    assert m.scope_kind("x", 1) == "comprehension"  # the element
    assert m.scope_kind("x", 3) == "module"  # the first iterable
    assert m.scope_kind("x", 4) == "comprehension"  # the condition
    assert m.scope_kind("x", 5) == "comprehension"  # the second loop's iterable
    assert m.kinds("x") == [K.ASSIGN, K.COMPREHENSION]
    assert [b.scope.kind for b in m.model.bindings("x")] == ["module", "comprehension"]
    assert m.scope_kind("items") == "module"
    for name in ("k", "v", "g", "s", "z"):
        assert m.scope_kind(name) == "comprehension", name
    assert m.model.bound_below_module("k")
    seen = m.model.assignment_seen_from("x", m.model.scope_of(m.name("x", 3)))
    assert seen is not None and seen.scope.kind == "module"
    assert m.model.assignment_seen_from("x", m.model.scope_of(m.name("x", 1))) is None


def test_class_body_comprehension_does_not_see_class_names() -> None:
    m = Mod(
        """
        import jax
        class C:
            jax = None
            a = [jax.pmap for _ in range(3)]
            b = [y for y in jax.pmap]
            c = jax.pmap
            def f(self):
                return jax.pmap
        """
    )
    assert m.attr("jax.pmap", 0) == "jax.pmap"  # element: skips the class body
    assert m.attr("jax.pmap", 1) is None  # first iterable: evaluated in the class body
    assert m.attr("jax.pmap", 2) is None  # the class body itself
    assert m.attr("jax.pmap", 3) == "jax.pmap"  # a method skips the class body


# Functions, lambdas, classes --------------------------------------------------------------------
def test_params_defaults_annotations_and_decorators() -> None:
    m = Mod(
        """
        import jax
        def outer():
            @jax.jit
            def inner(jax: jax.Array = jax.pmap, *args, k=1, **kw):
                return jax
            return inner
        """
    )
    assert m.attr("jax.jit") == "jax.jit"  # a decorator is read in the enclosing scope
    assert m.attr("jax.Array") == "jax.Array"  # so are annotations
    assert m.attr("jax.pmap") == "jax.pmap"  # and defaults
    assert m.means("jax", 5) is None  # the body's `jax` is the parameter
    body = m.model.scope_of(m.name("jax", 5))
    params = [b.name for bs in body.bindings.values() for b in bs if b.kind is K.PARAM]
    assert sorted(params) == ["args", "jax", "k", "kw"]
    assert m.kinds("inner") == [K.DEF]
    assert m.kinds("outer") == [K.DEF]
    assert not m.model.is_read(m.name("inner", 0))
    assert m.model.is_read(m.name("inner", 1))
    assert not m.model.is_read(m.name("k"))  # a parameter, not a read


def test_lambda_defaults_are_read_outside_and_params_inside() -> None:
    m = Mod("import jax\nf = lambda jax=jax.pmap: jax.pmap\n")
    assert m.attr("jax.pmap", 0) == "jax.pmap"
    assert m.attr("jax.pmap", 1) is None
    assert m.scope_kind("jax", 3) == "lambda"
    statement = m.module.body[1]
    assert isinstance(statement, cst.SimpleStatementLine)
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    made = m.model.scope_made_by(assign.value)
    assert made is not None and made.kind == "lambda"


def test_class_name_base_and_keyword() -> None:
    m = Mod("import jax\nclass Model(jax.Base, metaclass=Meta):\n    x = 1\nModel\n")
    assert m.kinds("Model") == [K.CLASS]
    assert m.attr("jax.Base") == "jax.Base"
    assert not m.model.is_read(m.name("metaclass"))
    (x,) = m.model.bindings("x")
    assert x.scope.kind == "class"


def test_global_and_nonlocal() -> None:
    m = Mod(
        """
        import jax
        def f():
            global jax
            return jax.pmap
        def g():
            n = 0
            def h():
                nonlocal n
                n = 1
            return n
        """
    )
    assert m.kinds("jax") == [K.IMPORT, K.GLOBAL]
    assert m.model.declared("jax") and m.model.declared("n")
    assert m.attr("jax.pmap") is None  # timid: left alone
    assert m.kinds("n") == [K.ASSIGN, K.NONLOCAL, K.ASSIGN]
    assert m.model.assignment_seen_from("n", m.model.scope_of(m.name("n", 3))) is None
    assert not m.model.is_read(m.name("n", 1))


# match ------------------------------------------------------------------------------------------
def test_match_captures() -> None:
    m = Mod(
        """
        match command:
            case Point(x=px, y=0) as whole:
                pass
            case [first, *rest]:
                pass
            case {"k": v, **others}:
                pass
            case _:
                pass
        """
    )
    for name in ("px", "whole", "first", "rest", "v", "others"):
        assert m.kinds(name) == [K.MATCH], name
        assert not m.model.is_read(m.name(name)), name
    assert m.model.bindings("x") == () and not m.model.is_read(m.name("x"))
    assert m.model.is_read(m.name("Point")) and m.model.is_read(m.name("command"))
    assert m.model.bindings("_") == ()  # the wildcard binds nothing


# Queries passes use -----------------------------------------------------------------------------
def test_names_for_new_code() -> None:
    m = Mod(
        """
        import jax as jx
        import numpy as np
        def f(np):
            return helper(np, key=1)
        """
    )
    assert m.model.module_alias("jax") == "jx"
    assert m.model.module_alias("numpy") is None  # a function rebinds `np`
    assert not m.model.is_free("helper") and m.model.is_free("fresh")
    assert m.model.is_unused("fresh") and not m.model.is_unused("helper")
    assert m.model.is_unused("key")  # a keyword is no read
    assert list(m.model.module_bindings()) == ["jx", "np", "f"]


def test_a_binding_made_after_the_module_runs_code_is_not_offered_to_new_code() -> None:
    """JAX's JAX_NeurIPS_2020_demo.ipynb: `PartitionSpec as P` is imported in a late cell, after
    a cell that runs a pmap; new code there must not spell `P` (NameError when the cell runs)."""
    early = Mod(
        """
        \"\"\"Doc.\"\"\"
        import jax
        from jax.sharding import PartitionSpec as P
        try:
            from functools import partial
        except ImportError:
            partial = None
        AXIS = "batch"
        def f(x):
            return x
        y = jax.pmap(f)(x)
        """
    )
    assert early.model.module_binding("jax.sharding.PartitionSpec") == "P"
    assert early.model.module_binding("functools.partial") is None  # two bindings conflict
    late = Mod(
        """
        import jax
        y = jax.pmap(lambda x: x ** 2)(x)
        from jax.sharding import PartitionSpec as P
        """
    )
    assert late.model.module_binding("jax.sharding.PartitionSpec") is None
    for runs in ("@jax.pmap\ndef g(x): pass", "class C:\n    g = jax.pmap(f)"):
        m = Mod(f"import jax\n{runs}\nfrom jax.sharding import PartitionSpec\n")
        assert m.model.module_binding("jax.sharding.PartitionSpec") is None, runs
    # Code that uses no legacy name gets no new code: a script's preamble before its imports
    # (`jax.config.update(...)`) does not hide them from new code in its functions.
    for runs in ("@jax.jit\ndef g(): pass", "class C: pass", "jax.config.update('a', 1)"):
        m = Mod(f"import jax\n{runs}\nfrom jax.sharding import PartitionSpec\n")
        assert m.model.module_binding("jax.sharding.PartitionSpec") == "PartitionSpec", runs


def test_a_late_partition_spec_import_is_not_used_before_it_runs() -> None:
    source = (
        "import jax\nimport jax.numpy as jnp\n\n"
        "y = jax.pmap(lambda x: x ** 2)(jnp.arange(8))\n\n"
        "from jax.sharding import PartitionSpec as P\n"
    )
    out = migrate_source(source, options=Options(unsafe_fixes=True)).code
    assert 'in_specs=jax.sharding.PartitionSpec("device")' in out, out
    assert "P(" not in out


def test_a_script_preamble_does_not_hide_its_later_imports_from_new_code() -> None:
    """`jax.config.update(...)` before a script's other imports (x64, distributed set-up): the
    rewrite in a function spells the script's own `P`, not `jax.sharding.PartitionSpec`."""
    source = (
        "import jax\n\njax.config.update('jax_enable_x64', False)\n\n"
        "from jax.sharding import PartitionSpec as P\n\n\n"
        "def f(x):\n    return jax.pmap(lambda v: v * 2, axis_name='i')(x)\n"
    )
    out = migrate_source(source, options=Options(unsafe_fixes=True)).code
    assert "in_specs=P('i')" in out and "jax.sharding.PartitionSpec(" not in out, out


def test_paths_to_marks_the_way_to_each_use() -> None:
    m = Mod("import jax\nx = 1\ndef f():\n    return jax.pmap(g)\n")
    paths = m.model.paths_to(("jax.pmap",))
    assert paths is not None
    statements = m.module.body
    assert id(statements[2]) in paths and id(statements[1]) not in paths
    assert m.model.paths_to(("jax.jit",)) is None  # not watched


def test_module_cache_builds_one_model_per_module_version() -> None:
    cache = ModuleCache(("jax.pmap",))
    first = cst.parse_module("import jax\n")
    model = cache.names(first)
    assert cache.names(first) is model
    second = first.with_changes(body=[*first.body, cst.parse_statement("x = 1\n")])
    assert cache.names(second) is not model
    assert cache.names(second).bound("x")


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    x: int\n    return x\n",
        "def f():\n    x: int = 1\n    return x\n",
    ],
)
def test_every_query_agrees_on_annotations(source: str) -> None:
    m = Mod(source)
    read = m.name("x", 1)
    scope = m.model.scope_of(read)
    assert m.model.lookup("x", scope) is scope  # local either way
    assert m.model.bound_below_module("x")
    assert m.model.qualified_name(read) is None
    assert m.model.assignment_seen_from("x", scope) is None  # neither is a plain `x = value`
