"""The emitter: a file's style (indentation, continuation, width, quotes), the project's
formatter configuration, the call layout engine, generated templates and import placement."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from jaxmigrate.config import formatting_in, project_formatting
from jaxmigrate.pipeline.engine import Options, migrate_source
from jaxmigrate.pipeline.project import Project
from jaxmigrate.toolkit.emit import (
    DEFAULT_WIDTH,
    Call,
    Room,
    Style,
    broken_comprehension,
    code,
    fit_call,
    fit_lines,
    fresh_name,
    infer_style,
    infer_width,
    is_read,
    with_keyword,
)
from jaxmigrate.toolkit.imports import add_imports


def wrapped(width: int, count: int = 5) -> list[str]:
    """Return `count` code lines exactly `width` columns long."""
    return [f"x = f({'a' * (width - 7)})" for _ in range(count)]


# Style detection --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "indent"),
    [
        ("def f():\n    return 1\n", "    "),
        ("def f():\n  return 1\n", "  "),
        ("class A:\n\tdef f(self):\n\t\treturn 1\n", "\t"),
        ("if x:  # a comment\n\n  # also a comment\n  y = 1\n", "  "),
        ("x = 1\n", "    "),  # no block: the default
    ],
)
def test_the_indentation_unit_is_the_first_blocks(source: str, indent: str) -> None:
    assert infer_style(source).indent == indent


def test_the_continuation_is_read_from_lines_after_an_opening_bracket() -> None:
    google = "def f():\n  y = g(\n      1, 2\n  )\n  z = h(\n      3\n  )\n"
    assert infer_style(google) == Style(indent="  ", continuation="    ")
    ruff_two = "def f():\n  y = g(\n    1, 2\n  )\n"
    assert infer_style(ruff_two).continuation == "  "
    # No evidence: Google style's 4 for 2-space code, else the unit.
    assert infer_style("def f():\n  return 1\n").continuation == "    "
    assert infer_style("def f():\n\treturn 1\n").continuation == "\t"


@pytest.mark.parametrize(
    ("lines", "width"),
    [
        (wrapped(80), 80),
        (wrapped(79), 79),
        (wrapped(80, 2), None),  # two lines near 80 are no evidence
        (["x = 1"] * 50, None),  # a short file says nothing
        ([*wrapped(80), *wrapped(86)], 88),
        ([*wrapped(80), *wrapped(95)], 100),
        ([*wrapped(80), *wrapped(110)], 120),
        ([*wrapped(80), *wrapped(150)], None),  # wrapped at no common width
        # Two long lines are forgiven, and comments and long strings never count.
        ([*wrapped(80), *wrapped(95, 2), "# " + "c" * 120, f"s = '{'s' * 100}'"], 80),
    ],
)
def test_the_width_is_inferred_only_from_evidence(lines: list[str], width: int | None) -> None:
    assert infer_width(lines) == width


def test_the_configured_width_wins_and_the_default_is_88() -> None:
    source = "\n".join(wrapped(80)) + "\n"
    assert infer_style(source).width == 80
    assert infer_style(source, width=100).width == 100
    assert infer_style("x = 1\n").width == DEFAULT_WIDTH == 88
    assert infer_style("x = 1\n", indent="  ").indent == "  "  # the file has no block
    assert infer_style("def f():\n    pass\n", indent="  ").indent == "    "  # the file wins


def test_the_quote_is_the_files_majority() -> None:
    assert infer_style("a = 'x'\nb = 'y'\nc = \"z\"\n").quote == "'"
    assert infer_style("a = 'x'\nb = \"y\"\n").quote == '"'
    assert Style(quote="'").string("i").value == "'i'"
    assert Style(quote="'").string("it's").value == '"it\'s"'


# The project's configuration --------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("name", "text", "width", "indent"),
    [
        ("pyproject.toml", "[tool.ruff]\nline-length = 99\nindent-width = 2\n", 99, "  "),
        ("pyproject.toml", "[tool.black]\nline-length = 79\n", 79, None),
        ("pyproject.toml", "[tool.pyink]\nline-length = 80\npyink-indentation = 2\n", 80, "  "),
        ("ruff.toml", "line-length = 120\n", 120, None),
        ("setup.cfg", "[flake8]\nmax-line-length = 110\n", 110, None),
        ("setup.cfg", "[yapf]\ncolumn_limit = 90\n", 90, None),
        ("tox.ini", "[flake8]\nmax-line-length = 95\n", 95, None),
        (".style.yapf", "[style]\nbased_on_style = google\n", 80, None),
        (".style.yapf", "[style]\ncolumn_limit = 100\nindent_width = 2\n", 100, "  "),
        ("pyproject.toml", "[tool.other]\nx = 1\n", None, None),
        ("pyproject.toml", "not toml [", None, None),
    ],
)
def test_a_directorys_formatter_settings(
    tmp_path: Path, name: str, text: str, width: int | None, indent: str | None
) -> None:
    write(tmp_path / name, text)
    found = formatting_in(tmp_path)
    assert (found.width, found.indent) == (width, indent)


def test_the_nearest_configuration_wins_and_the_search_stops_at_the_root(tmp_path: Path) -> None:
    write(tmp_path / "setup.cfg", "[flake8]\nmax-line-length = 120\n")  # outside the project
    root = tmp_path / "project"
    write(root / "pyproject.toml", "[tool.black]\nline-length = 100\n")
    write(root / "pkg" / "tox.ini", "[flake8]\nmax-line-length = 90\n")
    assert project_formatting(root / "pkg" / "deep" / "mod.py") == (90, None)
    assert project_formatting(root / "other" / "mod.py") == (100, None)
    write(tmp_path / "bare" / "pyproject.toml", "[project]\nname = 'bare'\n")
    assert project_formatting(tmp_path / "bare" / "mod.py") == (None, None)


def test_the_engine_reads_each_directory_once(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", "[tool.ruff]\nline-length = 70\n")
    project = Project()
    assert project.style("x = 1\n", str(tmp_path / "a.py")).width == 70
    assert tmp_path in project.formatting
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 50\n")
    assert project.style("x = 1\n", str(tmp_path / "b.py")).width == 70  # read once
    assert Project().style("x = 1\n", str(tmp_path / "b.py")).width == 50
    assert project.style("x = 1\n", None).width == DEFAULT_WIDTH  # no path: the code alone


def test_first_party_modules_are_the_projects_own(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", "[project]\nname = 'app'\n")
    write(tmp_path / "tools.py", "")
    write(tmp_path / "src" / "lib" / "__init__.py", "")
    write(tmp_path / "app" / "__init__.py", "")
    write(tmp_path / "app" / "train" / "__init__.py", "")
    write(tmp_path / "app" / "train" / "models.py", "")
    first = Project().first_party(str(tmp_path / "app" / "train" / "loop.py"))
    assert {"app", "train", "models", "tools", "lib"} <= first
    assert "jax" not in first


# Helpers ----------------------------------------------------------------------------------------
def test_small_helpers() -> None:
    arg = cst.Arg(cst.Name("x"))
    assert code(cst.Call(cst.Name("f"), [with_keyword(arg, "y")])) == "f(y=x)"
    assert fresh_name(["a", "b"], {"a"}) == "b"
    assert fresh_name(["a", "b"], {"a", "b", "b_"}) == "b__"
    assign = cst.parse_statement("for x in y: x += 1").body  # type: ignore[attr-defined]
    assert isinstance(assign, cst.SimpleStatementSuite)
    loop = cst.parse_statement("for x in y: pass")
    assert isinstance(loop, cst.For) and isinstance(loop.target, cst.Name)
    assert not is_read(loop.target, loop)
    assert is_read(loop.iter, loop)  # type: ignore[arg-type]
    default = cst.parse_statement("def f(p=q): pass")
    assert isinstance(default, cst.FunctionDef)
    param = default.params.params[0]
    assert not is_read(param.name, param) and is_read(param.default, param)  # type: ignore[arg-type]


# The call layout engine -------------------------------------------------------------------------
def call(text: str) -> cst.Call:
    node = cst.parse_expression(text)
    assert isinstance(node, cst.Call)
    return node


def test_a_call_that_fits_stays_on_its_line() -> None:
    laid = Call.of(call("f(a, b)")).laid_out(Room("", 0), Style(width=10))
    assert code(laid) == "f(a, b)"


def test_a_call_too_long_is_hugged_then_exploded_with_a_trailing_comma() -> None:
    style = Style(width=20, continuation="    ")
    hugged = Call.of(call("function(alpha, beta)")).laid_out(Room("", 0), style)
    assert code(hugged) == "function(\n    alpha, beta\n)"
    exploded = Call.of(call("function(alpha, beta, gamma, delta)")).laid_out(Room("", 0), style)
    assert code(exploded) == "function(\n    alpha,\n    beta,\n    gamma,\n    delta,\n)"


def test_continuation_lines_follow_the_line_the_call_starts_on() -> None:
    """A call on a continuation line of its own (a lambda in a tuple in a list) is laid out
    from that line's indentation, never from column 0 or the statement's."""
    style = Style(indent="  ", continuation="    ", width=40)
    line = '    ("pmap", lambda f: function(alpha, beta, gamma)),'
    column = line.index("function")
    laid = Call.of(call("function(alpha, beta, gamma)")).laid_out(
        Room.of_line(line, column, 3), style
    )
    assert code(laid) == "function(\n        alpha, beta, gamma\n    )"


def test_nested_calls_are_split_in_turn_and_comments_force_one_per_line() -> None:
    style = Style(width=38)
    laid = Call.of(call("outer(inner(aaaaaaaa, bbbbbbbb, cccccccc))")).laid_out(Room("", 0), style)
    assert code(laid) == "outer(\n    inner(\n        aaaaaaaa, bbbbbbbb, cccccccc\n    )\n)"
    commented = call("f(a,  # why\n  b)")
    assert code(Call.of(commented).laid_out(Room("", 0), style)) == "f(\n    a,  # why\n    b,\n)"


def test_a_call_without_arguments_too_long_splits_the_call_it_is_a_method_of() -> None:
    """`f(x).flatten()` past the width: `f(x)` is split as black splits it, the method call
    after its closing bracket (it crashed: no argument to hug)."""
    style = Style(width=30)
    laid = Call.of(call("gather(aaaaaaaa, bbbbbbbbbb).flatten()")).laid_out(Room("", 0), style)
    assert code(laid) == "gather(\n    aaaaaaaa, bbbbbbbbbb\n).flatten()"
    assert (
        code(Call.of(call("name_far_too_long_for_it()")).laid_out(Room("", 0), Style(width=8)))
        == "name_far_too_long_for_it()"
    )


@pytest.mark.parametrize(
    ("source", "width", "expected"),
    [
        # `gather(...).reshape(` past the width: the short trailer is omitted, `gather` split
        (
            "gather(aaaaaaaa, bbbbbbbbbb).reshape(-1)",
            36,
            "gather(\n    aaaaaaaa, bbbbbbbbbb\n).reshape(-1)",
        ),
        # `gather(...).reshape(` fits: split at the last bracket, as black and ruff do
        (
            "gather(aaaaaaaa, bbbb).reshape(cccccccccc, dddddddddd)",
            36,
            "gather(aaaaaaaa, bbbb).reshape(\n    cccccccccc, dddddddddd\n)",
        ),
    ],
)
def test_a_method_of_a_calls_result_is_split_where_black_splits_it(
    source: str, width: int, expected: str
) -> None:
    """black's right-hand split omits a trailer (`.reshape(-1)`) when the line up to its
    bracket does not fit: `f(x).reshape(\n    -1\n)` was written where black and ruff write
    `f(\n    x\n).reshape(-1)` (the flat readback of a program-level result)."""
    laid = Call.of(call(source)).laid_out(Room("", 0), Style(width=width))
    assert code(laid) == expected


def test_fit_call_keeps_multiline_calls_unless_rearranged() -> None:
    old = call("g(\n    a,\n    b,\n)")
    new = call("h(\n    b,\n    a,\n)")
    style = Style(width=80)
    assert fit_call(old, new, Room("", 0), style) is new
    assert code(fit_call(old, new, Room("", 0), style, rearranged=True)) == "h(b, a)"


def test_generated_lines_are_wrapped_to_the_width() -> None:
    source = (
        "def helper(first_argument, second_argument, third_argument):\n"
        '    """A docstring that is rather longer than the width allows."""\n'
        "    value = compute(first_argument, second_argument)  # a comment that moves\n"
        "    return value\n"
    )
    out = fit_lines(source, Style(width=56))
    assert all(len(line) <= 56 for line in out.splitlines()), out
    assert out.splitlines()[:3] == [
        "def helper(",
        "    first_argument, second_argument, third_argument",
        "):",
    ]
    assert "    # a comment that moves" in out.splitlines()
    compile(out, "helper", "exec")
    assert fit_lines(source, Style(width=100)) == source
    assert Style(indent="  ").reindent(source).splitlines()[-1] == "  return value"


# Import placement -------------------------------------------------------------------------------
def added(source: str, *requests: tuple[str, str | None, str | None], first: str = "") -> str:
    module = cst.parse_module(textwrap.dedent(source))
    return add_imports(module, list(requests), frozenset(first.split())).code


def test_a_new_import_goes_into_its_sections_group_never_after_first_party() -> None:
    source = """\
        import os

        import jax

        import models
        from . import local

        x = 1
        """
    out = added(source, ("numpy", None, "np"), ("functools", None, None), first="models")
    assert out.startswith("import functools\nimport os\n\nimport jax\nimport numpy as np\n\n")


def test_a_name_joining_a_sorted_from_import_goes_at_its_place() -> None:
    out = added("from jax.sharding import PartitionSpec as P\n", ("jax.sharding", "Mesh", None))
    assert out == "from jax.sharding import Mesh, PartitionSpec as P\n"
    out = added("from m import CONST, Klass, func\n", ("m", "Other", None), ("m", "go", None))
    assert out == "from m import CONST, Klass, Other, func, go\n"
    unsorted = "from m import b, a\n"  # the file's own order: the name goes last
    assert added(unsorted, ("m", "c", None)) == "from m import b, a, c\n"
    wrapped = "from m import (\n    a,\n    c,\n)\n"  # one name a line: a line of its own
    assert added(wrapped, ("m", "b", None)) == "from m import (\n    a,\n    b,\n    c,\n)\n"
    wrapped = "from m import (\n    c,\n    a,\n)\n"
    assert added(wrapped, ("m", "b", None)) == "from m import (\n    c,\n    a,\n    b,\n)\n"


def test_sorted_groups_get_the_import_at_its_place_in_either_order() -> None:
    isort = "import jax\nimport numpy as np\nfrom jax import lax\n\nx = 1\n"
    out = added(isort, ("jax.numpy", None, "jnp"), ("jax.sharding", "Mesh", None))
    assert out.startswith(
        "import jax\nimport jax.numpy as jnp\nimport numpy as np\nfrom jax import lax\n"
        "from jax.sharding import Mesh\n"
    )
    google = "from absl import app\nimport jax\nimport numpy as np\nfrom t5x import decoding\n"
    out = added(google, ("jax.experimental", "io_callback", None), first="t5x")
    assert out == (
        "from absl import app\nimport jax\nfrom jax.experimental import io_callback\n"
        "import numpy as np\nfrom t5x import decoding\n"
    )


def test_google_order_sorts_by_the_full_path_of_what_is_imported() -> None:
    """flax's imagenet example: `from jax import lax` is `jax.lax`, so `import jax.numpy` comes
    before `from jax import random`; numpy then goes between `ml_collections` and `optax`, not
    after the group's last line."""
    flax = (
        "from absl import logging\nimport flax\nfrom flax import jax_utils\nimport jax\n"
        "from jax import lax\nimport jax.numpy as jnp\nfrom jax import random\n"
        "import ml_collections\nimport optax\nimport tensorflow_datasets as tfds\n\n"
        "import models\n"
    )
    out = added(flax, ("numpy", None, "np"), ("jax.sharding", "PartitionSpec", "P"), first="models")
    assert out == (
        "from absl import logging\nimport flax\nfrom flax import jax_utils\nimport jax\n"
        "from jax import lax\nimport jax.numpy as jnp\nfrom jax import random\n"
        "from jax.sharding import PartitionSpec as P\nimport ml_collections\nimport numpy as np\n"
        "import optax\nimport tensorflow_datasets as tfds\n\nimport models\n"
    )


def test_google_order_by_module_alone_is_kept_too() -> None:
    """flax's lm1b example sorts by module alone (`from jax import random` is `jax`, before
    `import jax.numpy`): a new import takes its place in that order."""
    lm1b = (
        "from flax.training import train_state\nimport jax\nfrom jax import random\n"
        "import jax.numpy as jnp\nimport ml_collections\nimport numpy as np\n"
    )
    out = added(lm1b, ("jax.sharding", "PartitionSpec", "P"), ("flax._pmap_compat", "f", None))
    assert out == (
        "from flax._pmap_compat import f\nfrom flax.training import train_state\nimport jax\n"
        "from jax import random\nimport jax.numpy as jnp\n"
        "from jax.sharding import PartitionSpec as P\nimport ml_collections\nimport numpy as np\n"
    )


def test_a_group_mixing_sections_google_style_gets_the_import_at_its_sorted_place() -> None:
    """chex's and scenic's tests: their own package sorted among the third-party modules."""
    chex = (
        "from absl.testing import absltest\nfrom chex._src import asserts\nimport jax\n"
        "import jax.numpy as jnp\nimport numpy as np\n\nx = 1\n"
    )
    out = added(
        chex,
        ("chex._pmap_compat", "shard_map_per_device", None),
        ("jax.sharding", "PartitionSpec", "P"),
        first="chex",
    )
    assert out == (
        "from absl.testing import absltest\nfrom chex._pmap_compat import shard_map_per_device\n"
        "from chex._src import asserts\nimport jax\nimport jax.numpy as jnp\n"
        "from jax.sharding import PartitionSpec as P\nimport numpy as np\n\nx = 1\n"
    )
    # JAX's own tests: `jax` is the first party, numpy after it in the same group.
    tests = "from absl.testing import absltest\nimport jax\nfrom jax._src import core\nimport numpy as np\n"
    out = added(tests, ("jax._pmap_compat", "shard_map_per_device", None), first="jax")
    assert out == (
        "from absl.testing import absltest\nimport jax\n"
        "from jax._pmap_compat import shard_map_per_device\nfrom jax._src import core\n"
        "import numpy as np\n"
    )


def test_an_unsorted_group_gets_the_import_after_its_sections_last() -> None:
    out = added("import numpy as np\nimport jax\nimport trainer\n", ("optax", None, None),
                first="trainer")  # fmt: skip
    assert out == "import numpy as np\nimport jax\nimport optax\nimport trainer\n"


def test_a_missing_section_gets_a_group_of_its_own() -> None:
    out = added('"""Doc."""\n\nimport jax\n\nx = 1\n', ("functools", None, None))
    assert out == '"""Doc."""\n\nimport functools\n\nimport jax\n\nx = 1\n'
    out = added("import os\n\nx = 1\n", ("jax", None, None))
    assert out == "import os\n\nimport jax\n\nx = 1\n"


def test_the_t5x_host_callback_rewrite_reads_like_the_projects_own_code() -> None:
    """t5x's decoding_test.py before JAX removed host_callback: 2-space, 80 columns."""
    lines = [
        "from absl.testing import absltest",
        "import jax",
        "from jax.experimental import host_callback as hcb",
        "import numpy as np",
        "from t5x import decoding",
        "",
        "",
        "class DecodeTest(absltest.TestCase):",
        "",
        "  def test_callback(self):",
        "    def callback_fn(args):",
        "      return args",
        "",
        "    def state_callback_fn(state):",
        "      sequences = hcb.call(",
        "          callback_fn,",
        "          (state.cur_index, state.sequences),",
        "          result_shape=jax.ShapeDtypeStruct(",
        "              state.sequences.shape, state.sequences.dtype",
        "          ),",
        "      )",
        "      return state.replace(sequences=sequences)",
        *(f"    # {'x' * 74}" for _ in range(3)),
        *(f"    y = decoding.f({'a' * 59})" for _ in range(3)),
    ]
    new = migrate_source("\n".join(lines) + "\n", options=Options(unsafe_fixes=True)).code
    assert "from jax.experimental import io_callback\nimport numpy as np\n" in new
    assert (
        "      sequences = io_callback(\n"
        "          callback_fn,\n"
        "          jax.ShapeDtypeStruct(state.sequences.shape, state.sequences.dtype),\n"
        "          (state.cur_index, state.sequences),\n"
        "          ordered=True,\n"
        "      )\n"
    ) in new
    assert max(len(line) for line in new.splitlines()) <= 80


def test_a_tuple_too_long_for_its_own_line_is_exploded_as_black_does() -> None:
    """AlgoPerf's archived baselines pmap 9 arguments: the `in_specs` tuple is 94 columns on its
    own line in an 80-column project, so it gets one element per line."""
    specs = ", ".join(["None", "None", *["P('batch')"] * 5, "P()", "P()"])
    call = cst.parse_expression(f"helper(update, axis_name='batch', in_specs=({specs}), n=1)")
    assert isinstance(call, cst.Call)
    style = Style(indent="  ", width=80)
    laid = code(Call.of(call).laid_out(Room("  ", 12), style))
    assert max(len("  pmapped = " + line) for line in laid.splitlines()) <= 80, laid
    assert "      in_specs=(\n          None,\n" in laid and "          P(),\n      ),\n" in laid
    assert ast.dump(ast.parse(laid)) == ast.dump(ast.parse(code(call)))  # the same call
    assert code(Call.of(call).laid_out(Room("", 0), Style(width=200))).count("\n") == 0


def test_a_nested_tuple_too_long_for_its_own_line_is_exploded_in_turn() -> None:
    """JAX's pmap_test.py: `in_axes=((0, 0, 0), 0)` spelled with `jax.sharding.PartitionSpec`
    made a 127-column line inside the exploded `in_specs` of an 80-column file."""
    spec = "jax.sharding.PartitionSpec('device')"
    call = cst.parse_expression(
        f"helper(lambda x, y: x, axis_name='device', in_specs=(({spec}, {spec}, {spec}), {spec}))"
    )
    assert isinstance(call, cst.Call)
    laid = code(Call.of(call).laid_out(Room("    ", 8), Style(indent="  ", width=80)))
    assert max(len("    f = " + line) for line in laid.splitlines()) <= 80, laid
    assert f"        in_specs=(\n            (\n                {spec},\n" in laid, laid
    assert f"                {spec},\n            ),\n            {spec},\n        ),\n" in laid
    assert ast.dump(ast.parse(laid)) == ast.dump(ast.parse(code(call)))  # the same call


def test_an_operation_too_long_for_its_own_line_breaks_before_its_operators() -> None:
    """big_vision's flexi trainers: `in_specs=(P("batch"), ...) + (None,) * len(names)` was 108
    columns in an 80-column file; black and ruff break before the `+`, then explode the tuple if
    it is still too long."""
    specs = ", ".join(['P("batch")'] * 5)
    call = cst.parse_expression(
        f'partial(helper, axis_name="batch", in_specs=({specs}) + (None,) * len(names), n=1)'
    )
    assert isinstance(call, cst.Call)
    laid = code(Call.of(call).laid_out(Room("  ", 3), Style(indent="  ", width=80)))
    assert max(len("  @" + line) for line in laid.splitlines()) <= 80, laid
    assert f"      in_specs=({specs})\n      + (None,) * len(names),\n" in laid, laid
    narrow = code(Call.of(call).laid_out(Room("    ", 8), Style(width=50)))
    assert '        in_specs=(\n            P("batch"),\n' in narrow, narrow
    assert "        )\n        + (None,) * len(names),\n" in narrow, narrow
    for text in (laid, narrow):
        assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(code(call)))  # the same call
    chain = cst.parse_expression("f(x=first_of_them + second_of_them * 2 - third_of_them)")
    assert isinstance(chain, cst.Call)
    split = code(Call.of(chain).laid_out(Room("", 0), Style(width=30)))
    assert split == (
        "f(\n    x=first_of_them\n    + second_of_them * 2\n    - third_of_them,\n)"
    ), split


# The diff's finish (issue 19, item 4) -----------------------------------------------------------
def test_google_style_files_get_one_imported_name_per_line() -> None:
    """brax and flax import one name per `from` line: so do the new imports."""
    brax = (
        "from typing import Any, Callable\n"
        "from brax import envs\nfrom brax.training import acting\nfrom brax.training import types\n"
        "import flax\nimport jax\nimport jax.numpy as jnp\nimport numpy as np\n"
    )
    out = added(
        brax,
        ("jax.sharding", "Mesh", None),
        ("jax.sharding", "NamedSharding", None),
        ("jax.sharding", "PartitionSpec", "P"),
    )
    assert "from jax.sharding import Mesh\nfrom jax.sharding import NamedSharding\n" in out
    assert "from jax.sharding import PartitionSpec as P\nimport numpy as np\n" in out
    # ... and never join a line that exists: `from jax import lax` stays one name.
    out = added(brax + "from jax import lax\n", ("jax", "random", None))
    assert "from jax import lax\n" in out and "from jax import random\n" in out
    # A file that imports several names a line keeps doing so.
    out = added(
        "from jax.sharding import Mesh, NamedSharding\n", ("jax.sharding", "PartitionSpec", "P")
    )
    assert out == "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"


def test_an_unsorted_group_gets_the_import_after_its_own_package() -> None:
    """flax's imagenet example: not after `tensorflow_datasets`, after the last `jax` line."""
    source = (
        "import flax\nfrom flax import jax_utils\nimport jax\nfrom jax import lax\n"
        "import jax.numpy as jnp\nfrom jax import random\nimport optax\n"
        "import tensorflow_datasets as tfds\n"
    )
    out = added(source, ("jax.sharding", "PartitionSpec", "P"))
    assert (
        "from jax import random\nfrom jax.sharding import PartitionSpec as P\nimport optax\n" in out
    )


def pmap_script(tmp_path: Path, body: str) -> str:
    """Return the faithful rewrite of a script in `tmp_path` whose `make()` holds `body`."""
    script = tmp_path / "train.py"
    source = (
        "import functools\n\nimport jax\n\n\ndef train_step(state, batch):\n"
        '  return jax.lax.pmean(state + batch, "batch")\n\n\ndef make(config):\n'
        + textwrap.indent(textwrap.dedent(body), "  ")
    )
    script.write_text(source)
    project = Project()
    result = migrate_source(
        source,
        options=Options(unsafe_fixes=True, pmap_style="faithful"),
        path=str(script),
        home=project.home(script, source),
        project=project,
    )
    return result.code


def test_a_trailing_comment_stays_on_the_line_it_ended(tmp_path: Path) -> None:
    """flax's lm1b/nlp_seq/wmt: `donate_argnums=(0,))  # pytype: disable=...`."""
    out = pmap_script(
        tmp_path,
        """\
        p_train_step = jax.pmap(
            train_step,
            axis_name="batch",
            donate_argnums=(0,))  # pytype: disable=wrong-arg-types
        p_eval = jax.pmap(train_step, axis_name="batch", donate_argnums=(0,))  # noqa: E501
        return p_train_step, p_eval
        """,
    )
    assert "      donate_argnums=(0,),  # pytype: disable=wrong-arg-types\n  )\n" in out
    assert "  p_eval = shard_map_per_device(  # noqa: E501\n" in out
    assert not any(line.strip().startswith(")  #") for line in out.splitlines())


def test_the_helpers_import_is_first_party(tmp_path: Path) -> None:
    """A script's helper, imported from the module written beside it: a group of its own after
    the third-party imports, as isort puts a module of the code base."""
    out = pmap_script(tmp_path, 'return jax.pmap(train_step, axis_name="batch")\n')
    assert out.startswith(
        "import functools\n\nimport jax\nfrom jax.sharding import PartitionSpec as P\n\n"
        "from _pmap_compat import shard_map_per_device\n"
    )


def test_comments_on_a_rewritten_pmap_name_what_replaced_it(tmp_path: Path) -> None:
    """flax's imagenet ("pmean only works inside pmap") and vision_transformer ("pmap replicates
    the models"): the comments right above (and ending) the statement whose pmap is gone."""
    out = pmap_script(
        tmp_path,
        """\
        # a pmap comment above a blank line: about something else, left alone

        # pmean only works inside pmap because it needs an axis name.
        # This function will average the inputs across all devices.
        p_mean = jax.pmap(lambda x: jax.lax.pmean(x, "x"), "x")  # see jax.pmap
        other = jax.jit(lambda x: x)  # not a pmap
        return p_mean, other
        """,
    )
    assert "  # a pmap comment above a blank line: about something else, left alone\n" in out
    assert "  # pmean only works inside shard_map because it needs an axis name.\n" in out
    assert "shard_map_per_device(  # see jax.shard_map\n" in out
    assert "other = jax.jit(lambda x: x)  # not a pmap\n" in out


def test_an_import_removed_keeps_its_group_apart(tmp_path: Path) -> None:
    """`import jax` gone, `from jax import lax` stays in its own group, not the stdlib's."""
    source = "import functools\n\nimport jax\nfrom jax import lax\n\nf = jax.pmap(lambda x: lax.psum(x, 'i'), 'i')\n"
    script = tmp_path / "train.py"
    script.write_text(source)
    project = Project()
    out = migrate_source(
        source,
        options=Options(unsafe_fixes=True, pmap_style="faithful"),
        path=str(script),
        home=project.home(script, source),
        project=project,
    ).code
    assert out.startswith("import functools\n\nfrom jax import lax\n")


def test_a_call_over_several_lines_that_grows_past_the_width_is_laid_out_anew(
    tmp_path: Path,
) -> None:
    """t5x's utils_test: `None` -> `jax.sharding.PartitionSpec()` under a legacy mesh made the
    hugged line 86 columns in an 80-column file."""
    source = textwrap.dedent(
        """\
        import jax
        from jax.experimental.pjit import pjit
        from jax.sharding import Mesh


        def as_sharded_array(arr, axes, mesh: Mesh):
          with mesh:
            return pjit(
                lambda x: x, in_axis_resources=None, out_axis_resources=axes
            )(arr)
        """
    )
    (tmp_path / "pyproject.toml").write_text("[tool.pyink]\nline-length = 80\n")
    path = tmp_path / "utils_test.py"
    out = migrate_source(source, options=Options(unsafe_fixes=True), path=str(path)).code
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "        in_shardings=jax.sharding.PartitionSpec(),\n" in out, out


def test_a_google_style_file_of_plain_imports_gets_from_imports_at_their_module() -> None:
    """big_vision's evaluators: only `import` lines (both orders fit), 2-space indentation:
    Google's order, a `from` import at its module's place, not after every `import`."""
    source = (
        "import big_vision.pp.builder as pp_builder\nimport jax\nimport jax.numpy as jnp\n"
        "import numpy as np\n\n\ndef f():\n  return 1\n"
    )
    out = added(source, ("jax.sharding", "PartitionSpec", "P"))
    assert (
        "import jax.numpy as jnp\nfrom jax.sharding import PartitionSpec as P\nimport numpy" in out
    )
    four = source.replace("  return", "    return")
    out = added(four, ("jax.sharding", "PartitionSpec", "P"))  # isort's order: `from` last
    assert out.startswith(four.split("\n\n")[0] + "\nfrom jax.sharding import PartitionSpec as P\n")


@pytest.mark.parametrize(
    ("source", "laid"),
    [
        # the body fits on a line of its own: hugged, as black writes it
        (
            "[score(params, global_batch(x)) for x in batches]",
            "[\n        score(params, global_batch(x)) for x in batches\n    ]",
        ),
        # it does not: each `for` and `if` on a line of its own
        (
            "{k: score(params, global_batch(x)) for k, x in batches.items() if x.size > 0}",
            (
                "{\n        k: score(params, global_batch(x))\n        for k, x in batches.items()"
                "\n        if x.size > 0\n    }"
            ),
        ),
        # a comment inside, or parentheses around: as it is
        ("[f(x) for x in xs  # each\n]", "[f(x) for x in xs  # each\n]"),
    ],
)
def test_a_long_comprehension_is_broken_inside_its_own_brackets(source: str, laid: str) -> None:
    node = cst.parse_expression(source)
    assert isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp))
    assert code(broken_comprehension(node, "    ", "        ", 60)) == laid
