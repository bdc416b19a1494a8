"""Property tests: every pass over generated programs.

For any program, `migrate_source(code, options=Options(unsafe_fixes=True))` (the whole pipeline,
every pass) never raises, its output parses (libcst and Python's own parser), running it again
changes nothing, and code outside the rewritten sites is byte-for-byte unchanged.

Two kinds of program:
- arbitrary valid Python from hypothesmith, alone and with legacy sites spliced around it;
- real-world-like programs composed from snippets: imports in their many spellings, pmap / pjit /
  shard_map / `with mesh:` / device_put_* sites, decoys (user functions called `pmap`, strings and
  comments naming the APIs, modern code), comments, decorators, nested defs, match statements,
  tabs, CRLF.

"Outside the rewritten sites" is checked with sentinels: a unique top-level statement sits
between any two snippets, so the text between two sentinels is one snippet. Every sentinel must
come out identical and in order, and a snippet with no legacy site in it must come out identical
(a new import or the pmap helper may only be *inserted* after a top-level import line, never edit
one). Every site must be reported on a line of a snippet that holds a site.

CI runs a small fixed-seed budget. The long run explores fresh programs each time:

    JAXMIGRATE_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py -p no:cacheprovider
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import note as hypothesis_note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from jaxmigrate.model import Options, Site
from jaxmigrate.pipeline.engine import Migration, migrate_source
from jaxmigrate.textio import source_lines

LONG = int(os.environ.get("JAXMIGRATE_FUZZ_EXAMPLES", "0"))
OPTIONS = Options(unsafe_fixes=True)
SENTINEL = re.compile(r"^_jm_sentinel_(\d+) = \1\r?\n?$")
HELPER = "shard_map_per_device"


def budget(ci_examples: int) -> settings:
    """Fixed seed and a few examples in CI; `JAXMIGRATE_FUZZ_EXAMPLES` fresh ones otherwise."""
    return settings(
        max_examples=LONG or ci_examples,
        derandomize=not LONG,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


# --- The checks every program must pass ----------------------------------------------------


def note(text: str) -> None:
    """Print `text` with a failing example (and nothing outside hypothesis)."""
    if currently_in_test_context():
        hypothesis_note(text)


def python_parses(code: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings of generated code are not our business
        try:
            compile(code, "<fuzz>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True


def libcst_parses(code: str) -> bool:
    try:
        cst.parse_module(code)
    except (cst.ParserSyntaxError, RecursionError):
        return False
    return True


def migrate(code: str, accept: Callable[[Sequence[Site]], Sequence[Site]] | None = None) -> str:
    """Run the pipeline; return the new code after asserting the properties of any output."""
    result = migrate_source(code, options=OPTIONS, accept=accept)
    note(f"sites: {[(s.code, s.line, s.applied) for s in result.sites]}")
    note(f"skips: {[(s.code, s.line, s.reason) for s in result.skips]}")
    if not any(s.applied for s in result.sites):
        assert result.code == code, "nothing applied, yet the code changed"
        return result.code
    note(f"output:\n{result.code}")
    assert libcst_parses(result.code), "the output does not parse (libcst)"
    if python_parses(code):
        assert python_parses(result.code), "the output does not compile (Python)"
    if "\r\n" in code and "\n" not in code.replace("\r\n", ""):
        assert "\n" not in result.code.replace("\r\n", ""), "a CRLF file got LF lines"
    return result.code


def check_fixed_point(code: str) -> Migration:
    """Migrate `code`, then the result again: the second run must change nothing."""
    first = migrate_source(code, options=OPTIONS)
    out = migrate(code)
    assert out == first.code
    again = migrate_source(out, options=OPTIONS)
    if again.code != out:
        note(f"second run changed it to:\n{again.code}")
    assert again.code == out, "not a fixed point: a second run changed the output"
    return first


# --- Real-world-like programs --------------------------------------------------------------


@dataclass(frozen=True)
class Spelling:
    """How a program refers to each legacy API, and the imports that make it so."""

    names: dict[str, str]
    imports: tuple[str, ...]


# Each API: (how the code names it, the import lines that bind that name).
SPELLINGS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "pmap": [
        ("jax.pmap", ()),
        ("jx.pmap", ("import jax as jx",)),
        ("pmap", ("from jax import pmap",)),
        ("pm", ("from jax import pmap as pm",)),
    ],
    "pjit": [
        ("pjit", ("from jax.experimental.pjit import pjit",)),
        ("pjl.pjit", ("import jax.experimental.pjit as pjl",)),
        ("pjit_lib.pjit", ("from jax.experimental import pjit as pjit_lib",)),
        ("jax.experimental.pjit.pjit", ("import jax.experimental.pjit",)),
    ],
    "shard_map": [
        ("shard_map", ("from jax.experimental.shard_map import shard_map",)),
        ("shmap.shard_map", ("import jax.experimental.shard_map as shmap",)),
        ("jax.experimental.shard_map.shard_map", ("import jax.experimental.shard_map",)),
        ("smap", ("from jax.experimental.shard_map import shard_map as smap",)),
    ],
    "replicated": [
        ("jax.device_put_replicated", ()),
        ("jx.device_put_replicated", ("import jax as jx",)),
        ("device_put_replicated", ("from jax import device_put_replicated",)),
    ],
    "sharded": [
        ("jax.device_put_sharded", ()),
        ("device_put_sharded", ("from jax import device_put_sharded",)),
        ("dps", ("from jax import device_put_sharded as dps",)),
    ],
    "Mesh": [
        ("Mesh", ("from jax.sharding import Mesh",)),
        ("Mesh", ("from jax.experimental.maps import Mesh",)),
        ("maps.Mesh", ("from jax.experimental import maps",)),
        ("jax.sharding.Mesh", ()),
    ],
    "P": [
        ("P", ("from jax.sharding import PartitionSpec as P",)),
        ("P", ("from jax.experimental import PartitionSpec as P",)),
        ("PartitionSpec", ("from jax.sharding import PartitionSpec",)),
        ("jax.sharding.PartitionSpec", ()),
    ],
}
BASE_IMPORTS = (
    "import functools",
    "import jax",
    "import numpy as np",
    "from functools import partial",
    "from jax import lax",
)


@st.composite
def spellings(draw: st.DrawFn) -> Spelling:
    names: dict[str, str] = {}
    imports: list[str] = []
    for api, options in SPELLINGS.items():
        name, lines = draw(st.sampled_from(options))
        names[api] = name
        imports.extend(lines)
    return Spelling(names, tuple(dict.fromkeys(imports)))


# Snippets with legacy sites. `{k}` is a number unique to the snippet; `{name}` a user name that
# may collide with an API's; the rest are the program's spellings.
SITES = [
    """@functools.partial({pmap}, axis_name="batch")
def {name}(params, batch):
    grads = jax.grad(loss_fn)(params, batch)
    return jax.lax.pmean(grads, axis_name="batch")
""",
    """@{pmap}
def {name}(x, y):
    return x + y
""",
    """{name} = {pmap}(lambda x: x * 2)
""",
    """p_step_{k} = {pmap}(step_{k}, axis_name="i", in_axes=(0, None), static_broadcasted_argnums=2)
""",
    """def outer_{k}(xs):
    def inner(x):
        return x - lax.pmean(x, "d")

    return {pmap}(inner, axis_name="d")(xs)
""",
    """@partial({pmap}, axis_name="i", donate_argnums=(0,))
@partial({pmap}, axis_name="j")
def nested_{k}(x):
    return lax.psum(x, ("i", "j"))
""",
    """class Trainer{k}:
    @functools.partial({pmap}, axis_name="batch", static_broadcasted_argnums=0)
    def step(self, x):
        return lax.pmean(x, "batch")
""",
    """{name} = {pjit}(fn, in_axis_resources={P}("data"), out_axis_resources=None)
""",
    """@functools.partial({pjit}, in_shardings=({P}("x"), None), out_shardings={P}("x"))
def {name}(p, g):
    return p - 0.1 * g
""",
    """def run_{k}(devices, step, batch):
    mesh = {Mesh}(devices, ("data",))
    with mesh:
        return step(batch)
""",
    """def train_{k}(devices, x):
    with {Mesh}(np.array(devices), ("x",)) as mesh:
        f = {pjit}(lambda v: v * 2, in_shardings={P}("x"), out_shardings={P}("x"))
        return f(x)
""",
    """def blocks_{k}(mesh):
    return {shard_map}(lambda v: v - lax.pmean(v, "i"), mesh, {P}("i"), {P}("i"), check_rep=False)
""",
    """def decorated_{k}(mesh, x):
    @partial({shard_map}, mesh=mesh, in_specs={P}("x", "y"), out_specs={P}("x"))
    def row_sums(block):
        return lax.psum(block.sum(axis=1, keepdims=True), "y")

    return jax.jit(row_sums)(x)
""",
    """{name} = {replicated}(np.arange(6.0).reshape(2, 3), jax.devices())
""",
    """y_{k} = {sharded}([np.full((2, 3), i) for i in range(8)], jax.devices())
""",
    """def make_{k}(devices):
    return {Mesh}(devices, ("x",)), {P}("x", None)
""",
    """match mode_{k}:
    case "train":
        step_{k} = {pmap}(update, axis_name="batch")
    case _:
        step_{k} = None
""",
    """try:
    out_{k} = {pmap}(f)(x)  # jaxmigrate: skip
except ValueError:
    out_{k} = None
""",
    """def local_import_{k}(fn):
    from jax.experimental.pjit import pjit

    return pjit(fn, in_shardings=None)
""",
]
# Snippets with no legacy site: each must come out byte-for-byte identical.
DECOYS = [
    '''def helper_{k}(x):
    """Calls jax.pmap(f) in the documentation only; `with mesh:` too."""
    return x  # jax.pmap(f, axis_name="i")
''',
    """class Model{k}:
    def pmap(self, f, **kwargs):
        return f

    def shard_map(self, f):
        return self.pmap(f, axis_name="i")
""",
    """def local_shadow_{k}(xs):
    def pmap(f, axis_name=None):
        return f

    return pmap(lambda v: v, axis_name="i")(xs)
""",
    """def uses_parameter_{k}(pmap, shard_map, xs):
    return shard_map(pmap(lambda v: v))(xs)
""",
    """match command_{k}:
    case {{"pmap": fn, **rest}}:
        result = fn(rest)
    case [first, *others] if first:
        result = others
    case Point(x=0, y=yy) | Point(x=yy, y=0):
        result = yy
    case str() as text:
        result = text
    case _:
        result = None
""",
    """async def fetch_{k}(session, url):
    async with session.get(url) as resp:
        async for chunk in resp:
            yield chunk
""",
    """with open(path_{k}) as fh, lock:
    data_{k} = fh.read()
""",
    """values_{k} = [y for y in range(10) if (z := y % 3)]
label_{k} = f"{{values_{k}!r:>10}} {{'nested'}}"
""",
    """try:
    import fancy_{k}
except* ValueError as group:
    pass
finally:
    cleanup()
""",
    """@dataclasses.dataclass(frozen=True)
class Config{k}:
    mesh_shape: tuple[int, ...] = (8,)
    axis: str = "data"
""",
    """step_{k} = jax.jit(jax.shard_map(lambda v: v, mesh=mesh, in_specs={P}(), out_specs={P}()))
""",
    """with jax.set_mesh(mesh_{k}):
    out_{k} = step(batch)
""",
    "if flag_{k}:\n\tx_{k} = 1\n\tif x_{k}:\n\t\ty_{k} = 2\n",
    """a_{k} = 1; b_{k} = 2  # semicolons
c_{k} = (a_{k} +
     b_{k})
d_{k} = a_{k} \\
    + b_{k}
""",
    """café_{k} = "naïve ünïcode"  # ☃
""",
    """table_{k} = {{"pmap": lambda f: f, "pjit": lambda f: f}}
""",
    """def gen_{k}():
    x = yield
    return (yield from x)
""",
    """class Outer{k}:
    class Inner:
        def method(self):
            def nested():
                value = 1
                return value

            return nested
""",
    """with contextlib.nullcontext() as ctx_{k}:
    pass
""",
    """# only a comment: with mesh: jax.pmap(f) pjit(g)
""",
    """rows_{k} = jax.device_put(x, jax.sharding.NamedSharding(mesh, {P}("i")))
""",
    """import os
""",
    """from jax.sharding import NamedSharding
""",
    """from jax import numpy as jnp, tree_util
""",
    """print("with mesh:", "jax.pmap", r"\\d", b"bytes", 0x1F, 1_000, 1e-3, 2j)
""",
    """def typed_{k}(x: "jax.Array", *args: int, key: str = "k", **kw: float) -> None:
    del x, args, key, kw
""",
    """lambda_{k} = lambda *a, **k: (a, k)
""",
    """if __name__ == "__main__":
    main()
""",
]
COMMENTS = ["# a note", "# jaxmigrate: skip", "# jaxmigrate: skip[JM201]", "# type: ignore", "#"]
BLOCKS = [
    ("if True:\n", ""),
    ("class Holder{k}:\n", ""),
    ("def wrapper_{k}():\n", ""),
    ("try:\n", "except ImportError:\n    pass\n"),
    ("with contextlib.suppress(Exception):\n", ""),
    ("for _ in range(2):\n", ""),
]
USER_NAMES = ["step", "train_step", "pmap", "pjit", "shard_map", "f", "mesh", "update", "p_step"]


@dataclass(frozen=True)
class Piece:
    text: str
    has_site: bool


@st.composite
def site_piece(draw: st.DrawFn, spelling: Spelling, k: int) -> Piece:
    template = draw(st.sampled_from(SITES))
    name = draw(st.sampled_from(USER_NAMES)) + draw(st.sampled_from(["", f"_{k}"]))
    text = template.format(k=k, name=name, **spelling.names)
    lines = text.splitlines(keepends=True)
    if draw(st.booleans()):  # comments at line ends and on lines of their own
        out = []
        for line in lines:
            choice = draw(st.integers(0, 5))
            body = line.rstrip("\n")
            if choice == 0 and "#" not in body:
                line = f"{body}  {draw(st.sampled_from(COMMENTS))}\n"
            elif choice == 1:
                indent = len(body) - len(body.lstrip())
                out.append(" " * indent + draw(st.sampled_from(COMMENTS)) + "\n")
            elif choice == 2:
                out.append("\n")
            out.append(line)
        lines = out
    if draw(st.integers(0, 3)) == 0:  # inside a block, indented by one of the usual units
        opening, closing = draw(st.sampled_from(BLOCKS))
        unit = draw(st.sampled_from(["    ", "  ", "\t"]))
        indented = [unit + line if line.strip() else line for line in lines]
        lines = [opening.format(k=k), *indented, *closing.splitlines(keepends=True)]
    return Piece("".join(lines), has_site=True)


@st.composite
def decoy_piece(draw: st.DrawFn, spelling: Spelling, k: int) -> Piece:
    template = draw(st.sampled_from(DECOYS))
    return Piece(template.format(k=k, P=spelling.names["P"]), has_site=False)


@dataclass(frozen=True)
class Program:
    """A generated program: its header (imports) and its pieces, sentinels between them."""

    header: str
    pieces: tuple[Piece, ...]
    crlf: bool

    @property
    def code(self) -> str:
        parts = [self.header]
        for k, piece in enumerate(self.pieces):
            parts.append(f"_jm_sentinel_{k} = {k}\n")
            parts.append(piece.text)
        parts.append(f"_jm_sentinel_{len(self.pieces)} = {len(self.pieces)}\n")
        text = "".join(parts)
        return text.replace("\n", "\r\n") if self.crlf else text


@st.composite
def programs(draw: st.DrawFn) -> Program:
    spelling = draw(spellings())
    imports = list(dict.fromkeys([*BASE_IMPORTS, *spelling.imports]))
    imports = draw(st.permutations(imports))
    keep = draw(st.lists(st.booleans(), min_size=len(imports), max_size=len(imports)))
    header_lines = [line for line, kept in zip(imports, keep) if kept or "jax" in line]
    preamble = draw(
        st.sampled_from(["", '"""A module."""\n', "#!/usr/bin/env python\n# Copyright\n"])
    )
    future = draw(st.sampled_from(["", "from __future__ import annotations\n"]))
    header = preamble + future + "".join(line + "\n" for line in header_lines)
    count = draw(st.integers(1, 8))
    pieces = []
    for k in range(count):
        if draw(st.integers(0, 2)):
            pieces.append(draw(site_piece(spelling, k)))
        else:
            pieces.append(draw(decoy_piece(spelling, k)))
    return Program(header, tuple(pieces), crlf=draw(st.integers(0, 5)) == 0)


def chunks(code: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Split `code` at sentinel lines: the texts between them and the 1-based line span of each."""
    texts, spans = [""], [(1, 0)]
    for number, line in enumerate(source_lines(code, keepends=True), start=1):
        match = SENTINEL.match(line)
        if match is not None:
            assert int(match.group(1)) == len(texts) - 1, f"sentinel out of order: {line!r}"
            texts.append("")
            spans.append((number + 1, number))
        else:
            texts[-1] += line
            spans[-1] = (spans[-1][0], number)
    return texts, spans


def only_insertions_after_imports(before: str, after: str) -> bool:
    """True if `after` is `before` with new imports or the pmap helper put after its last line,
    which is a top-level import line (where the passes add what a rewrite needs)."""
    if not after.startswith(before):
        return False
    last = [line for line in before.splitlines() if line.strip()][-1:]
    if not last or not re.match(r"(import|from)\s", last[0]):
        return False
    try:
        added = cst.parse_module(after[len(before) :])
    except cst.ParserSyntaxError:
        return False
    for statement in added.body:
        is_import = isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
        )
        is_helper = isinstance(statement, cst.FunctionDef) and statement.name.value == HELPER
        if not (is_import or is_helper):
            return False
    return True


def check_outside_sites(program: Program, source: str, result: Migration, out: str) -> None:
    """Sentinels survive in order, decoys are untouched, sites are reported inside site pieces."""
    before, spans = chunks(source)
    after, _ = chunks(out)
    assert len(after) == len(before), "a sentinel was lost or duplicated"
    for k, piece in enumerate(program.pieces):
        if not piece.has_site:
            ok = after[k + 1] == before[k + 1] or only_insertions_after_imports(
                before[k + 1], after[k + 1]
            )
            assert ok, f"a snippet with no site changed:\n{before[k + 1]!r}\n->\n{after[k + 1]!r}"
    allowed = [spans[0]] + [spans[k + 1] for k, p in enumerate(program.pieces) if p.has_site]
    for site in result.sites:
        inside = any(lo <= site.line <= hi for lo, hi in allowed)
        assert inside, f"{site.code} reported at line {site.line}, outside every site snippet"


# --- The properties ------------------------------------------------------------------------


@budget(ci_examples=60)
@given(programs())
def test_real_world_like_programs(program: Program) -> None:
    source = program.code
    note(f"program:\n{source}")
    assert python_parses(source), "the generator made an invalid program"
    result = check_fixed_point(source)
    check_outside_sites(program, source, result, result.code)


@budget(ci_examples=40)
@given(programs(), st.data())
def test_any_subset_of_sites(program: Program, data: st.DataObject) -> None:
    """The engine re-runs the passes with some sites off (review, verification): still valid."""
    source = program.code
    note(f"program:\n{source}")
    sites = migrate_source(source, options=OPTIONS).sites
    assume(sites)
    keep = data.draw(st.lists(st.booleans(), min_size=len(sites), max_size=len(sites)))

    def accept(decided: Sequence[Site]) -> Sequence[Site]:
        return [replace(s, applied=on) for s, on in zip(decided, keep)]

    out = migrate(source, accept)
    result = migrate_source(source, options=OPTIONS, accept=accept)
    check_outside_sites(program, source, result, out)


@budget(ci_examples=40)
@given(hypothesmith.from_grammar())
def test_arbitrary_python(code: str) -> None:
    """hypothesmith's programs, as they come: nearly always no site, so nothing may change."""
    assume(python_parses(code) and libcst_parses(code))
    check_fixed_point(code)


@budget(ci_examples=40)
@given(hypothesmith.from_grammar(), programs())
def test_arbitrary_python_among_sites(code: str, program: Program) -> None:
    """Arbitrary Python spliced between legacy sites: the passes read all of it, change none."""
    if not code.endswith("\n"):
        code += "\n"
    wild = Piece(code, has_site=False)
    pieces = (*program.pieces[:1], wild, *program.pieces[1:])
    spliced = replace(program, pieces=pieces, crlf=False)
    source = spliced.code
    note(f"program:\n{source}")
    assume(python_parses(source) and libcst_parses(source))
    result = check_fixed_point(source)
    check_outside_sites(spliced, source, result, result.code)


@budget(ci_examples=8)
@given(hypothesmith.from_node())
def test_arbitrary_syntax_trees(code: str) -> None:
    """hypothesmith's libcst-built programs reach syntax the grammar strategy rarely makes."""
    assume(python_parses(code) and libcst_parses(code))
    check_fixed_point(code)


def test_sentinel_check_catches_an_edit() -> None:
    """The check itself: a decoy edited outside any site is caught."""
    program = Program("import jax\n", (Piece("x = 1\n", has_site=False),), crlf=False)
    source = program.code
    result = Migration(source.replace("x = 1", "x = 2"), (), ())
    with pytest.raises(AssertionError, match="no site changed"):
        check_outside_sites(program, source, result, result.code)


def test_generated_programs_have_sites() -> None:
    """The generator is worth running: most of its site snippets are found by some pass."""
    found = []
    spelling = Spelling({api: options[0][0] for api, options in SPELLINGS.items()}, ())
    header = "".join(f"{line}\n" for line in BASE_IMPORTS)
    header += "from jax.experimental.pjit import pjit\n"
    header += "from jax.experimental.shard_map import shard_map\n"
    header += "from jax.sharding import Mesh, PartitionSpec as P\n"
    for k, template in enumerate(SITES):
        code = header + template.format(k=k, name=f"user_{k}", **spelling.names)
        result = migrate_source(code, options=OPTIONS)
        found.append(bool(result.sites or result.skips))
    assert sum(found) >= len(SITES) - 1, [t for t, f in zip(SITES, found) if not f]


# --- What the long runs found (each fixed; kept as plain regression tests) -------------------


def test_found_an_unimported_name_is_not_bound_by_a_new_import() -> None:
    """`functools` read but never imported: `import functools` would give it a meaning, and the
    second run rewrote the site the first had to leave (not a fixed point)."""
    source = (
        "import jax as jx\n\n"
        '@functools.partial(jx.pmap, axis_name="batch")\n'
        "def step(x):\n    return x\n\n"
        "@jx.pmap\n"
        "def g(x, y):\n    return x + y\n"
    )
    result = check_fixed_point(source)
    assert "import functools as functools_\n" in result.code
    assert '@functools.partial(jx.pmap, axis_name="batch")' in result.code


def test_found_a_parameter_named_like_the_module_is_not_shadowing_new_code() -> None:
    """Code emitted inside `def f(jax, ...)` must not mean the parameter by `jax`."""
    source = "from jax import pmap\n\n\ndef f(jax, xs):\n    return pmap(lambda x: x * 2)(xs)\n"
    result = check_fixed_point(source)  # the helper (module level) owns the jax.jit
    assert "import jax as jax_\n" in result.code and "= jax_.jit(on_devices" in result.code
    assert "return shard_map_per_device(" in result.code
    source = "import jax as jx\nfrom jax import pmap\n\n\ndef f(jx, xs):\n    return pmap(g)(xs)\n"
    result = check_fixed_point(source)
    body = result.code[result.code.index("def f(jx") :]
    assert "return shard_map_per_device(" in body and "jx." not in body


def test_found_an_import_below_code_is_not_joined() -> None:
    """A `from jax.sharding import ...` line below code was extended with the `P` a site above
    it needs: edited far from any site, and bound only after the decorator that used it ran."""
    source = (
        "import jax\n\n"
        "if True:\n    @jax.pmap\n    def step(x, y):\n        return x + y\n\n"
        "from jax.sharding import NamedSharding\n"
    )
    result = check_fixed_point(source)
    assert result.code.endswith("\nfrom jax.sharding import NamedSharding\n")
    head = result.code[: result.code.index("if True:")]
    assert "from jax.sharding import PartitionSpec as P\n" in head


def test_found_a_form_feed_shifts_no_line() -> None:
    """`str.splitlines` also breaks at form feeds (and \\x1c-\\x1e, \\x85, \\u2028): after one,
    the suppression comment was looked up on the wrong line and the site rewritten anyway."""
    for separator in ("\x0c", "\x1e", "\u2028"):
        source = f"import jax\n#{separator}\n\n@jax.pmap  # jaxmigrate: skip\ndef step(x, y):\n    return x + y\n"
        result = migrate_source(source, options=OPTIONS)
        assert result.code == source and not result.sites
        assert [(s.line, s.suppressed) for s in result.skips] == [(4, True)]
