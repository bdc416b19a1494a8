"""Summaries of the code base's own helpers: a def returning one row of the transfer table of a
parameter is read through that row, once; anything more than the row is no summary."""

from __future__ import annotations

import libcst as cst
import pytest

from codemods.pmap._forms import Forms
from codemods.pmap._layout import TRANSFERS
from codemods.pmap._summary import Summaries, summarize

NAMES = {
    "jax.tree.map": "jax.tree.map",
    "np.broadcast_to": "numpy.broadcast_to",
    "jax.local_device_count": "jax.local_device_count",
    "jax.device_get": "jax.device_get",
}


def qualname(node: cst.BaseExpression) -> str | None:
    text = cst.Module([]).code_for_node(node)
    return NAMES.get(text)


def helper(text: str) -> cst.FunctionDef:
    node = cst.parse_statement(text)
    assert isinstance(node, cst.FunctionDef)
    return node


@pytest.mark.parametrize(
    ("text", "row", "source", "counts"),
    [
        (
            "def r(tree, n):\n    return jax.tree.map(lambda a: np.broadcast_to(a, (n, *a.shape)), tree)\n",
            "broadcast_to",
            0,
            (1,),
        ),
        (
            (
                'def r(x):\n    """Doc."""\n    k = jax.local_device_count()\n'
                "    return np.broadcast_to(x, (k,) + x.shape)\n"
            ),
            "broadcast_to",
            0,
            (),
        ),
        ("def s(n, b):\n    return b.reshape((n, -1) + b.shape[1:])\n", "reshape", 1, (0,)),
        ("def u(tree):\n    return jax.tree.map(lambda a: a[0], tree)\n", "index", 0, ()),
    ],
)
def test_a_helper_returning_a_row_of_a_parameter_is_summarized(
    text: str, row: str, source: int, counts: tuple[int, ...]
) -> None:
    found = summarize(helper(text), qualname)
    assert found is not None and found.row.name == row
    assert (found.source, found.counts) == (source, counts)


@pytest.mark.parametrize(
    "text",
    [
        "def r(tree, n, scale):\n    return np.broadcast_to(tree, (n,) + tree.shape)\n",  # unread
        "def r(tree, n=8):\n    return np.broadcast_to(tree, (n,) + tree.shape)\n",  # default
        "def r(tree, n):\n    print(n)\n    return np.broadcast_to(tree, (n,) + tree.shape)\n",
        "def r(tree):\n    return np.broadcast_to(tree, (4,) + tree.shape)\n",  # not the count
        "def r(tree, n):\n    return tree\n",  # no row
        "def r(tree, n):\n    if n:\n        pass\n    return np.broadcast_to(tree, (n,) + tree.shape)\n",
        "@cache\ndef r(tree, n):\n    return np.broadcast_to(tree, (n,) + tree.shape)\n",
    ],
)
def test_a_helper_doing_more_than_one_row_has_no_summary(text: str) -> None:
    assert summarize(helper(text), qualname) is None


def test_a_call_is_read_through_the_summary_only_with_the_device_count_passed() -> None:
    rep = helper("def rep(tree, n):\n    return np.broadcast_to(tree, (n,) + tree.shape)\n")
    forms = Forms(qualname, lambda n: cst.Module([]).code_for_node(n) == "n", {"rep": rep})
    table = TRANSFERS
    good = cst.parse_expression("rep(params, n)")
    found = forms.transfer(good, table)
    assert found is not None and found.row.name == "broadcast_to"
    assert cst.Module([]).code_for_node(found.source) == "params"
    assert forms.transfer(cst.parse_expression("rep(params, 2)"), table) is None
    assert forms.transfer(cst.parse_expression("rep(params, n=n)"), table) is None
    summaries = forms.summaries
    assert isinstance(summaries, Summaries) and list(summaries.known) == ["rep"]  # read once


MEAN = cst.parse_expression('jax.pmap(lambda x: jax.lax.pmean(x, "x"), "x")')
MEAN_NAMES = NAMES | {"jax.pmap": "jax.pmap", "jax.lax.pmean": "jax.lax.pmean"}


def mean_qualname(node: cst.BaseExpression) -> str | None:
    return MEAN_NAMES.get(cst.Module([]).code_for_node(node))


@pytest.mark.parametrize(
    "text",
    [
        "def sync(state):\n    return state.replace(batch_stats=mean(state.batch_stats))\n",
        'def sync(state):\n    return state.copy({"batch_stats": mean(state["batch_stats"])})\n',
        "def sync(stats):\n    return mean(stats)\n",
    ],
)
def test_a_mean_over_devices_of_a_field_is_that_row_of_the_whole(text: str) -> None:
    """flax imagenet's `sync_batch_stats`, AlgoPerf's `model_state.copy(...)`: the mean of equal
    copies keeps the value, so the whole parameter is what it was (the module's `mean =
    jax.pmap(lambda x: lax.pmean(x, "x"), "x")` read where called)."""
    found = summarize(helper(text), mean_qualname, {"mean": MEAN})
    assert found is not None and found.row.name == "cross_device_mean"
    assert found.source == 0


@pytest.mark.parametrize(
    "text",
    [
        "def sync(state):\n    return state.replace(batch_stats=mean(state.params))\n",  # other
        "def sync(state, other):\n    return state.replace(batch_stats=mean(other.batch_stats))\n",
        "def sync(state):\n    return state.replace(batch_stats=mean(state.batch_stats), a=1)\n",
        "def sync(mean, s):\n    return s.replace(batch_stats=mean(s.batch_stats))\n",  # shadows
        "def sync(state):\n    return state.replace(params=jax.tree.map(lambda a: a[0], state.params))\n",
    ],
)
def test_a_field_changed_otherwise_has_no_summary(text: str) -> None:
    assert summarize(helper(text), mean_qualname, {"mean": MEAN}) is None


NAMES |= {"jnp.asarray": "jax.numpy.asarray", "jax.tree_util.tree_map": "jax.tree_util.tree_map"}


def test_a_tree_map_of_a_nested_def_is_read_as_the_one_lambda_it_is() -> None:
    """brax's `_strip_weak_type`: `def f(leaf): leaf = jnp.asarray(leaf); return
    leaf.astype(leaf.dtype)`, mapped over the tree, keeps each leaf's layout."""
    text = (
        "def _strip_weak_type(tree):\n"
        "    # strips weak types\n"
        "    def f(leaf):\n"
        "        leaf = jnp.asarray(leaf)\n"
        "        return leaf.astype(leaf.dtype)\n"
        "    return jax.tree_util.tree_map(f, tree)\n"
    )
    found = summarize(helper(text), qualname)
    assert found is not None and found.row.name == "astype" and found.lifted
    assert found.row.template == "{value}"


def test_a_nested_def_is_rewritten_as_a_lambda_only_where_it_reads_its_parameter() -> None:
    from codemods.pmap._summary import as_lambda

    def lam(text: str) -> str | None:
        found = as_lambda(helper(text))
        return None if found is None else cst.Module([]).code_for_node(found)

    # an attribute's name and a keyword's stay, whatever they are called
    assert lam("def f(x):\n    x = y.x\n    return g(x, x=x)\n") == "lambda x: g(y.x, x=y.x)"
    assert lam("def f(x):\n    return x\n") == "lambda x: x"
    # another name bound, a name of its own, more than one parameter, a decorator: not one lambda
    assert lam("def f(x):\n    y = g(x)\n    return y\n") is None
    assert lam("def f(x):\n    return [x for x in x]\n") is None
    assert lam("def f(x, y):\n    return x\n") is None
    assert lam("@jit\ndef f(x):\n    return x\n") is None
    assert lam("def f(x):\n    x = g(x)\n") is None  # no return


@pytest.mark.parametrize("last", ["leaf * 2", "leaf[0]", "leaf.astype(jnp.float32)"])
def test_a_nested_def_doing_more_than_keeping_each_leaf_has_no_summary(last: str) -> None:
    """A row only through the carriers that keep each leaf (`jnp.asarray(leaf)[0]` is not read
    as device 0's copy of the tree: no summary, the value stays unknown)."""
    text = (
        "def changed(tree):\n"
        "    def f(leaf):\n"
        "        leaf = jnp.asarray(leaf)\n"
        f"        return {last}\n"
        "    return jax.tree_util.tree_map(f, tree)\n"
    )
    assert summarize(helper(text), qualname) is None
