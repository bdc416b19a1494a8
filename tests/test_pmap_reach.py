"""Reaching definitions in one function (`codemods/pmap/_reach.py`): which bindings of a name
may give each read its value; ENTRY is the value the function started with."""

from __future__ import annotations

import textwrap

import libcst as cst
from jaxmigrate.codemods.pmap._reach import ENTRY, Flow, Reach


def reaching(source: str) -> dict[str, list[str]]:
    """Return, for each `use(x)` read marked `# here`, which bindings reach it (their code on
    one line, `ENTRY` for the function's own value), by the comment's label."""
    module = cst.parse_module(textwrap.dedent(source))
    fun = module.body[0]
    assert isinstance(fun, cst.FunctionDef)
    reach = Reach(fun.body)
    found: dict[str, list[str]] = {}

    class Marks(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Name) and node.func.value == "use":
                label = node.args[1].value
                assert isinstance(label, cst.SimpleString)
                name = node.args[0].value
                assert isinstance(name, cst.Name)
                found[label.raw_value] = sorted(_text(b) for b in reach.of(name))

    fun.visit(Marks())
    return found


def _text(binding: cst.CSTNode) -> str:
    if binding is ENTRY:
        return "ENTRY"
    if isinstance(binding, (cst.For, cst.CompFor)):
        return f"for {cst.Module([]).code_for_node(binding.target)}"
    return " ".join(cst.Module([]).code_for_node(binding).split())


def test_a_later_binding_in_the_loop_hides_the_loop_variable() -> None:
    found = reaching(
        """
        def f(xs):
            for b in xs:
                use(b, "plain")
                b = shard(b)
                use(b, "split")
            use(b, "after")
        """
    )
    assert found["plain"] == ["for b"]
    assert found["split"] == ["b = shard(b)"]
    assert found["after"] == ["ENTRY", "b = shard(b)"]  # no iteration: `b` as it came


def test_branches_join_and_a_value_fed_back_reaches_the_loop_head() -> None:
    found = reaching(
        """
        def f(c):
            s = make()
            if c:
                s = other()
            for _ in range(3):
                use(s, "head")
                s = step(s)
            use(s, "end")
        """
    )
    assert found["head"] == ["s = make()", "s = other()", "s = step(s)"]
    assert found["end"] == ["s = make()", "s = other()", "s = step(s)"]


def test_return_break_and_continue_end_their_paths() -> None:
    found = reaching(
        """
        def f(c):
            x = 1
            while True:
                if c:
                    x = 2
                    break
                x = 3
                if c:
                    continue
                x = 4
                if c:
                    return x
            use(x, "after")
        """
    )
    assert found["after"] == ["x = 2"]


def test_a_handler_starts_anywhere_in_its_try_and_nested_code_sees_every_binding() -> None:
    found = reaching(
        """
        def f():
            x = 1
            try:
                x = 2
                x = 3
            except ValueError:
                use(x, "handler")
            g = lambda: use(x, "lambda")
            ys = [use(x, "comprehension") for x in range(3)]
            use(x, "after")
        """
    )
    assert found["handler"] == ["x = 1", "x = 2", "x = 3"]
    assert found["lambda"] == ["ENTRY", "x = 1", "x = 2", "x = 3"]  # whenever it is called
    assert found["comprehension"] == ["for x"]
    assert found["after"] == ["x = 1", "x = 2", "x = 3"]


def test_match_cases_join_as_branches_and_a_final_wildcard_leaves_no_path_around() -> None:
    found = reaching(
        """
        def f(mode, pair):
            x = 0
            match mode:
                case "a":
                    x = 1
                case "b" if use(x, "guard"):
                    x = 2
            use(x, "after partial")
            match pair:
                case [first, *rest]:
                    use(first, "capture")
                    y = first
                case _:
                    y = 3
            use(y, "after total")
            use(rest, "rest")
        """
    )
    assert found["guard"] == ["x = 0"]
    assert found["after partial"] == ["x = 0", "x = 1", "x = 2"]  # no case may match
    assert found["capture"] == ['case [first, *rest]: use(first, "capture") y = first']
    assert found["after total"] == ["y = 3", "y = first"]  # `case _:` takes the rest
    assert found["rest"] == ["ENTRY", 'case [first, *rest]: use(first, "capture") y = first']


def test_an_if_tests_walrus_binds_and_a_finally_passes_on_only_the_normal_paths() -> None:
    found = reaching(
        """
        def f(a, b):
            if (x := a) is not None:
                use(x, "then")
            if b and (y := a):
                pass
            use(y, "maybe")
            ws = [(w := v) for v in a]
            use(w, "comprehension")
            try:
                z = a
            finally:
                use(z, "finally")
            use(z, "after finally")
        """
    )
    assert found["then"] == ["(x := a)"]
    assert found["maybe"] == ["(y := a)", "ENTRY"]  # `b` false: `y` is not assigned
    assert found["comprehension"] == ["(w := v)", "ENTRY"]  # `a` empty: nor is `w`
    assert found["finally"] == ["ENTRY", "z = a"]  # an exception before `z = a` runs it too
    assert found["after finally"] == ["z = a"]  # ... and goes on raising after it


def test_flow_binds_and_reads_names_as_the_scope_model_does() -> None:
    """`Flow`, the one binding model of the pmap rule: the function's bindings and reads are the
    toolkit's scope model's (a comprehension's variable and a class body's names are theirs, not
    the function's; `except`/`import`/`with ... as` and `del` bind), and questions of order are
    reaching definitions' (a call in a loop runs before a binding above it in the text)."""
    source = textwrap.dedent(
        """
        def f(xs):
            out = None
            for x in xs:
                if out is not None:
                    x = x + 1
                out = step(x)
            ys = [y for y in xs]

            class C:
                z = 1

            try:
                pass
            except ValueError as e:
                pass
            import math as m
            with open(xs) as w:
                del w
            return out, ys, C, m
        """
    )
    fun = cst.parse_module(source).body[0]
    assert isinstance(fun, cst.FunctionDef)
    flow = Flow(fun)
    assert {"y", "z"}.isdisjoint(flow.stores) and {"e", "m", "w"} <= set(flow.stores)
    assert len(flow.stores["w"]) == 2  # `with ... as w` and `del w`
    assert "y" not in flow.loads and "w" not in flow.loads and len(flow.loads["x"]) == 2
    call = flow.loads["step"][0]
    rebound = flow.stores["x"][1]  # `x = x + 1`: before the call in the text, after it on a turn
    assert flow.ran_before(rebound, [call]) and not flow.ran_before(flow.stores["out"][0], [call])
    assert flow.value("ys") is not None and flow.only("x") is None


def test_a_nested_def_called_only_here_reads_what_reaches_its_calls() -> None:
    """uvim's `init` closure is called before the value it reads is replicated: its read sees
    the value as it was there, not the replication (was: every binding, and ENTRY)."""
    found = reaching(
        """
        def f(rng):
            task = setup()

            @functools.partial(jax.jit, backend="cpu")
            def init(key):
                use(task, "early")
                return model.init(key, jax.tree_map(lambda x: use(task, "lambda"), 0))

            params = init(rng)
            task = replicate(task)

            def late():
                use(task, "late")

            late()
            def passed():
                use(task, "passed")

            run(passed)
            return params
        """
    )
    assert found["early"] == ["task = setup()"]  # `model.init` is no read of `init`
    assert found["late"] == ["task = replicate(task)"]
    # a lambda inside may run later; a def passed on runs whenever its taker calls it
    assert found["lambda"] == ["ENTRY", "task = replicate(task)", "task = setup()"]
    assert found["passed"] == ["ENTRY", "task = replicate(task)", "task = setup()"]


def test_a_nested_def_read_other_than_called_or_a_generator_keeps_every_binding() -> None:
    found = reaching(
        """
        def f():
            x = a()

            def g():
                use(x, "stored")

            def gen():
                use(x, "generator")
                yield 1

            keep = g
            it = gen()
            g()
            x = b()
            list(it)
        """
    )
    assert found["stored"] == ["ENTRY", "x = a()", "x = b()"]
    assert found["generator"] == ["ENTRY", "x = a()", "x = b()"]


def test_a_with_item_reads_what_the_items_before_it_bind() -> None:
    found = reaching(
        """
        def f(g, h):
            x = 1
            with g() as x, h(use(x, "second")) as y:
                use(x, "body")
        """
    )
    assert found["second"] == ["g() as x,"]  # the items run in order, each bound before the next
    assert found["body"] == ["g() as x,"]
