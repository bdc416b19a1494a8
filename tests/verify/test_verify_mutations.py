"""The verifier tested by mutation: wrong rewrites must fail with a useful reason, right ones verify.

Every case is a hand-written original/rewrite pair (cookbook cases 01-04, 07, 10, 12, 14); all of
them run in one verification (one worker pair), real JAX on a simulated 8-device CPU mesh.
"""

from __future__ import annotations

import pytest
from verify_cases import Case, faithful, idiomatic, module, pmapped, verify_cases

from jaxmigrate.model import Status

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)
VERIFIED, FAILED, UNVERIFIED = Status.VERIFIED, Status.FAILED, Status.UNVERIFIED

# Rank-sensitive bodies (cookbook case 01): the idiomatic form (body unchanged, P("i")) is wrong.
RANK = {
    "divide_by_len": ("return x / x.shape[0]", "values differ"),
    "subtract_first": ("return x - x[0]", "values differ"),
    "softmax": ("return jax.nn.softmax(x, axis=0)", "values differ"),
    "outer": ("return jnp.outer(x, x)", "shape"),
    "scalar_sum": ("return x.sum()", "raised"),
}
RANK_CASES = [
    Case(f"idiomatic_{name}", pmapped(body), idiomatic(body), FAILED, why)
    for name, (body, why) in RANK.items()
] + [
    Case(f"faithful_{name}", pmapped(body), faithful(body), VERIFIED, alternative=idiomatic(body))
    for name, (body, _) in RANK.items()
    if name in {"divide_by_len", "outer", "scalar_sum"}
]
# When the body ignores the extra axis, the idiomatic form is offered (it verifies too).
ELEMENTWISE = "return jnp.tanh(x) * 2 + 1"
RANK_CASES.append(
    Case(
        "faithful_elementwise",
        pmapped(ELEMENTWISE),
        faithful(ELEMENTWISE),
        VERIFIED,
        alternative=idiomatic(ELEMENTWISE),
    )
)

PSUM = 'return lax.psum(x, "i")'
OUT_AXES_CASES = [
    # out_axes=0 of a psum'd value stays stacked: (8, 4), not (4,) (cookbook case 04).
    Case(
        "stacked_output_as_P",
        pmapped(PSUM),
        module("""
        mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
        step = jax.jit(jax.shard_map(lambda x: lax.psum(jnp.squeeze(x, 0), "i"), mesh=mesh,
                                     in_specs=P("i"), out_specs=P()))
        """),
        FAILED,
        "shape [4], expected [8, 4]",
    ),
    Case("stacked_output_faithful", pmapped(PSUM), faithful(PSUM), VERIFIED),
    Case(
        "out_axes_none",
        pmapped(PSUM, args='axis_name="i", out_axes=None'),
        module("""
        mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
        step = jax.jit(jax.shard_map(lambda x: lax.psum(jnp.squeeze(x, 0), "i"), mesh=mesh,
                                     in_specs=P("i"), out_specs=P()))
        """),
        VERIFIED,
    ),
    # Negative out_axes: 0.10.2's pmap is wrong here, so the vmap oracle is the reference.
    Case(
        "negative_out_axes",
        pmapped("return x * 2", args='axis_name="i", out_axes=-1'),
        module("""
        mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
        step = jax.jit(jax.shard_map(lambda x: jnp.expand_dims(jnp.squeeze(x, 0) * 2, 1),
                                     mesh=mesh, in_specs=P("i"), out_specs=P(None, "i")))
        """),
        VERIFIED,
        reference="vmap-oracle",
    ),
    Case(
        "negative_out_axes_on_axis_0",
        pmapped("return x * 2", args='axis_name="i", out_axes=-1'),
        faithful("return x * 2"),
        FAILED,
        "shape [8, 4], expected [4, 8]",
        reference="vmap-oracle",
    ),
]

IN_AXES_1 = pmapped('return x * 2 + lax.axis_index("i")', args='axis_name="i", in_axes=1')
IN_AXES_BODY = """
    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    def _body(x):
        return jnp.expand_dims(jnp.squeeze(x, 1) * 2 + lax.axis_index("i"), 0)
    step = jax.jit(jax.shard_map(_body, mesh=mesh, in_specs={spec}, out_specs=P("i")))
    """
IN_AXES_CASES = [
    Case(
        "missing_none_in_spec",
        IN_AXES_1,
        module(IN_AXES_BODY.format(spec='P("i")')),
        FAILED,
        "the rewrite raised",
    ),
    Case("none_in_spec", IN_AXES_1, module(IN_AXES_BODY.format(spec='P(None, "i")')), VERIFIED),
]

# A training step with replicated params (cookbook case 14): pmap(in_axes=(None, 0)).
TRAIN = """
def loss(w, x):
    return jnp.sum(jnp.tanh(x * w))
"""
TRAIN_PMAP = module(
    TRAIN
    + """

@partial(jax.pmap, axis_name="i", in_axes=(None, 0))  # SITE
def step(w, x):
    g = lax.pmean(jax.grad(loss)(w, x), "i")
    return w - 0.1 * g
"""
)
TRAIN_SHARD_MAP = (
    TRAIN
    + """
mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


def _body(w, x):
    g = jax.grad(loss)(w, jnp.squeeze(x, 0))
    g = {reduce}
    return jnp.expand_dims(w - 0.1 * g, 0)


step = jax.jit(jax.shard_map(_body, mesh=mesh, in_specs=(P(), P("i")), out_specs=P("i"){extra}))
"""
)
TRAIN_CASES = [
    Case(
        "pmean_kept_with_check_vma",
        TRAIN_PMAP,
        module(TRAIN_SHARD_MAP.format(reduce='lax.pmean(g, "i")', extra="")),
        FAILED,
        "values differ",
    ),
    Case(
        "divided_by_axis_size",
        TRAIN_PMAP,
        module(TRAIN_SHARD_MAP.format(reduce='g / lax.axis_size("i")', extra="")),
        VERIFIED,
    ),
    Case(
        "pmean_with_check_vma_false",
        TRAIN_PMAP,
        module(TRAIN_SHARD_MAP.format(reduce='lax.pmean(g, "i")', extra=", check_vma=False")),
        VERIFIED,
    ),
]

# out_axes=None on a value that varies: pmap returns device 0's; only check_vma=False keeps that.
VARYING = pmapped("return x * 2", args='axis_name="i", out_axes=None')
VARYING_SHARD_MAP = """
mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
step = jax.jit(jax.shard_map(lambda x: jnp.squeeze(x, 0) * 2, mesh=mesh, in_specs=P("i"),
                             out_specs=P(){extra}))
"""
CHECK_VMA_CASES = [
    Case(
        "dropped_check_vma_false",
        VARYING,
        module(VARYING_SHARD_MAP.format(extra="")),
        FAILED,
        "the rewrite raised",
    ),
    Case(
        "kept_check_vma_false",
        VARYING,
        module(VARYING_SHARD_MAP.format(extra=", check_vma=False")),
        VERIFIED,
    ),
]

# pjit under `with mesh:` (cookbook case 10): bare specs need jax.set_mesh after the rewrite.
PJIT = """
from jax.experimental.pjit import pjit

mesh = Mesh(np.array(jax.devices()), ("x",))


def fn(a):
    return jnp.sin(a) * 2


{define}


def run(a):
{call}
"""
PJIT_ORIGINAL = module(
    PJIT.format(
        define='f = pjit(fn, in_shardings=P("x"), out_shardings=P("x"))  # SITE',
        call="    with mesh:\n        return f(a)",
    )
)
JIT_BARE = 'f = jax.jit(fn, in_shardings=P("x"), out_shardings=P("x"))'
JIT_NAMED = "f = jax.jit(fn, in_shardings=NamedSharding(mesh, P('x')), out_shardings=NamedSharding(mesh, P('x')))"
PJIT_CASES = [
    Case(
        "pjit_to_jit_keeping_with_mesh",
        PJIT_ORIGINAL,
        module(PJIT.format(define=JIT_BARE, call="    with mesh:\n        return f(a)")),
        FAILED,
        "the rewrite raised",
        site_name="pjit",
    ),
    Case(
        "pjit_to_jit_without_context",
        PJIT_ORIGINAL,
        module(PJIT.format(define=JIT_BARE, call="    return f(a)")),
        FAILED,
        "the rewrite raised",
        site_name="pjit",
    ),
    Case(
        "pjit_to_jit_with_set_mesh",
        PJIT_ORIGINAL,
        module(
            PJIT.format(define=JIT_BARE, call="    with jax.set_mesh(mesh):\n        return f(a)")
        ),
        VERIFIED,
        site_name="pjit",
    ),
    Case(
        "pjit_to_jit_named_sharding",
        PJIT_ORIGINAL,
        module(PJIT.format(define=JIT_NAMED, call="    with mesh:\n        return f(a)")),
        VERIFIED,
        site_name="pjit",
    ),
    # The `with mesh:` site itself: its target is the enclosing function `run`.
    Case(
        "with_mesh_dropped",
        module(
            PJIT.format(
                define='f = pjit(fn, in_shardings=P("x"), out_shardings=P("x"))',
                call="    with mesh:  # SITE\n        return f(a)",
            )
        ),
        module(PJIT.format(define=JIT_BARE, call="    return f(a)")),
        FAILED,
        "the rewrite raised",
        site_name="with-mesh",
    ),
    Case(
        "with_mesh_to_set_mesh",
        module(
            PJIT.format(
                define='f = pjit(fn, in_shardings=P("x"), out_shardings=P("x"))',
                call="    with mesh:  # SITE\n        return f(a)",
            )
        ),
        module(
            PJIT.format(define=JIT_BARE, call="    with jax.set_mesh(mesh):\n        return f(a)")
        ),
        VERIFIED,
        site_name="with-mesh",
    ),
    # Removed keywords: the original cannot even be imported; pjit(in_shardings=...) is the reference.
    Case(
        "pjit_axis_resources",
        module(
            PJIT.format(
                define='f = pjit(fn, in_axis_resources=P("x"), out_axis_resources=P("x"))  # SITE',
                call="    with mesh:\n        return f(a)",
            )
        ),
        module(PJIT.format(define=JIT_NAMED, call="    return f(a)")),
        VERIFIED,
        site_name="pjit",
        reference="pjit-in-shardings",
    ),
]

# Nested pmap no longer runs in 0.10.2 (cookbook case 07): the nested-vmap oracle is the reference.
NESTED = module("""
def inner(v):
    return dict(j_sum=lax.psum(v, "j"), i_sum=lax.psum(v, "i"),
                idx=lax.axis_index("i") * 10 + lax.axis_index("j"))


step = jax.pmap(jax.pmap(inner, axis_name="j"), axis_name="i")  # SITE
__jaxmigrate_examples__ = {"step": [(np.arange(24, dtype=np.float32).reshape(2, 4, 3),)]}
""")
NESTED_SHARD_MAP = """
def inner(v):
    return dict(j_sum=lax.psum(v, "j"), i_sum=lax.psum(v, "i"),
                idx=lax.axis_index("i") * 10 + lax.axis_index("j"))


mesh = Mesh(np.array(jax.devices()[:8]).reshape({shape}), ("i", "j"))
step = jax.jit(jax.shard_map(lambda b: jax.tree.map(lambda o: o[None, None], inner(b[0, 0])),
                             mesh=mesh, in_specs=P("i", "j"), out_specs=P("i", "j")))
"""
REFERENCE_CASES = [
    Case(
        "nested_pmap",
        NESTED,
        module(NESTED_SHARD_MAP.format(shape="2, 4")),
        VERIFIED,
        reference="vmap-oracle",
    ),
    Case(
        "nested_pmap_axes_swapped",
        NESTED,
        module(NESTED_SHARD_MAP.format(shape="4, 2")),
        FAILED,
        reference="vmap-oracle",
    ),
]

# A callback in a partial-auto region raises (cookbook case 12): widened shard_map is the reference.
CALLBACK = """
mesh2 = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def host_sin(v):
    return np.sin(np.asarray(v))


def pure_sin(b):
    return jax.pure_callback(host_sin, jax.ShapeDtypeStruct(b.shape, b.dtype), b)


{inner}
step = jax.jit(jax.shard_map(lambda b: {call} * 2, mesh=mesh2, in_specs=P("data"),  # SITE
                             out_specs=P("data"), axis_names={{"data"}}))
"""
NESTED_CALLBACK = """
def nested(b):
    return jax.shard_map(pure_sin, in_specs=P(), out_specs=P(), axis_names={{"model"}},
                         check_vma=False{mesh})(b)
"""
CALLBACK_CASES = [
    Case(
        "callback_nested",
        module(CALLBACK.format(inner="", call="pure_sin(b)")),
        module(CALLBACK.format(inner=NESTED_CALLBACK.format(mesh=""), call="nested(b)")),
        VERIFIED,
        site_name="partial-auto-callback",
        reference="widened-shard-map",
    ),
    Case(
        "callback_nested_with_mesh",
        module(CALLBACK.format(inner="", call="pure_sin(b)")),
        module(
            CALLBACK.format(inner=NESTED_CALLBACK.format(mesh=", mesh=mesh2"), call="nested(b)")
        ),
        FAILED,
        "the rewrite raised",
        site_name="partial-auto-callback",
        reference="widened-shard-map",
    ),
]

# Typed PRNG keys and declared inputs (cookbook case 08).
KEYS = module("""
def __jaxmigrate_examples__():
    return {"step": [(jax.random.split(jax.random.key(0), 8),)]}


@jax.pmap  # SITE
def step(k):
    return jax.random.normal(k, (3,)), jax.random.split(k)
""")
KEYS_BODY = """
mesh = Mesh(np.array(jax.devices()[:8]), ("i",))


def _body(k):
    return jax.random.normal(k, (3,)), jax.random.split(k)


step = jax.jit(jax.shard_map({fn}, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
"""
FAITHFUL_KEYS = "lambda k: jax.tree.map(lambda o: o[None], _body(k[0]))"
KEY_CASES = [
    Case("keys_faithful", KEYS, module(KEYS_BODY.format(fn=FAITHFUL_KEYS)), VERIFIED),
    Case(
        "keys_idiomatic", KEYS, module(KEYS_BODY.format(fn="_body")), FAILED, "the rewrite raised"
    ),
]

# A pmap over 4 of the 8 devices (cookbook case 06): the recorded/declared calls show the size.
FOUR = """
__jaxmigrate_examples__ = {{"step": [(np.arange(12, dtype=np.float32).reshape(4, 3),)]}}
{define}
"""
FOUR_SHARD_MAP = """
mesh = Mesh(np.array(jax.devices()[:{n}]), ("i",))
step = jax.jit(jax.shard_map(lambda x: jnp.expand_dims(lax.psum(jnp.squeeze(x, 0), "i"), 0),
                             mesh=mesh, in_specs=P("i"), out_specs=P("i")))
"""
FOUR_PMAP = """
@partial(jax.pmap, axis_name="i")  # SITE
def step(x):
    return lax.psum(x, "i")
"""
MESH_SIZE_CASES = [
    Case(
        "four_of_eight_devices",
        module(FOUR.format(define=FOUR_PMAP)),
        module(FOUR.format(define=FOUR_SHARD_MAP.format(n=4))),
        VERIFIED,
    ),
    Case(
        "four_on_an_eight_device_mesh",
        module(FOUR.format(define=FOUR_PMAP)),
        module(FOUR.format(define=FOUR_SHARD_MAP.format(n=8))),
        FAILED,
        "not evenly divisible",
    ),
]

# Exactness of the comparison itself: small errors, dtypes and structure all count.
TOLERANCE_CASES = [
    Case(
        "relative_error_1e-4",
        pmapped("return x * 3"),
        faithful("return x * 3 * 1.0001"),
        FAILED,
        "max rel err 0.0001",
    ),
    Case(
        "float_noise_1e-7", pmapped("return x * 3"), faithful("return x * 3 * (1 + 1e-7)"), VERIFIED
    ),
    Case(
        "dtype_changed",
        pmapped("return x * 3"),
        faithful("return (x * 3).astype(jnp.bfloat16)"),
        FAILED,
        "dtype bfloat16, expected float32",
    ),
    Case(
        "tuple_became_list",
        pmapped("return (x, x * 2)"),
        module("""
            mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
            step = jax.jit(jax.shard_map(lambda x: [x, x * 2], mesh=mesh, in_specs=P("i"),
                                         out_specs=P("i")))
            """),
        FAILED,
        "pytree structure",
    ),
    Case(
        "integer_off_by_one",
        pmapped('return lax.axis_index("i") + jnp.int32(x.shape[0])'),
        faithful('return lax.axis_index("i") + jnp.int32(x.shape[0]) + (lax.axis_index("i") == 7)'),
        FAILED,
        "1 of 8 exact values differ",
    ),
]

# The original imports what JAX removed: its safe rewrites (here, the import move) are the reference.
OLD_IMPORTS = "from jax.experimental.maps import Mesh as LegacyMesh\n"
NEW_IMPORTS = "from jax.sharding import Mesh as LegacyMesh\n"
OLD_PJIT = PJIT.format(
    define='f = pjit(fn, in_axis_resources=P("x"), out_axis_resources=P("x"))  # SITE',
    call="    with LegacyMesh(np.array(jax.devices()), ('x',)):\n        return f(a)",
)
BASELINE_CASES = [
    Case(
        "removed_import",
        OLD_IMPORTS + pmapped("return x / x.shape[0]"),
        faithful("return x / x.shape[0]"),
        VERIFIED,
        reference="safe-rewrites",
        baseline=NEW_IMPORTS + pmapped("return x / x.shape[0]"),
    ),
    Case(
        "removed_import_and_keywords",
        OLD_IMPORTS + module(OLD_PJIT),
        module(PJIT.format(define=JIT_NAMED, call="    return f(a)")),
        VERIFIED,
        site_name="pjit",
        reference="safe-rewrites+pjit-in-shardings",
        baseline=NEW_IMPORTS + module(OLD_PJIT),
    ),
    Case(
        "removed_import_wrong_rewrite",
        OLD_IMPORTS + pmapped("return x / x.shape[0]"),
        idiomatic("return x / x.shape[0]"),
        FAILED,
        "values differ",
        reference="safe-rewrites",
        baseline=NEW_IMPORTS + pmapped("return x / x.shape[0]"),
    ),
]

# Nothing to call it with, or nothing to call.
UNREACHABLE_CASES = [
    Case(
        "static_args_no_inputs",
        pmapped("return x * n", args='axis_name="i", static_broadcasted_argnums=1', params="x, n"),
        faithful("return x * 2"),
        UNVERIFIED,
        '--verify-with "pytest tests/"',
    ),
    Case(
        "instance_attribute",
        module("""
        class Model:
            def __init__(self):
                self.step = jax.pmap(lambda x: x * 2)  # SITE
        """),
        module("class Model:\n    pass\n"),
        UNVERIFIED,
        "cannot be run alone",
    ),
]

CASES = (
    RANK_CASES
    + OUT_AXES_CASES
    + IN_AXES_CASES
    + TRAIN_CASES
    + CHECK_VMA_CASES
    + PJIT_CASES
    + REFERENCE_CASES
    + CALLBACK_CASES
    + KEY_CASES
    + MESH_SIZE_CASES
    + TOLERANCE_CASES
    + BASELINE_CASES
    + UNREACHABLE_CASES
)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return verify_cases(CASES, tmp_path_factory.mktemp("mutations") / "project")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case(case: Case, verdicts: dict) -> None:
    verdict = verdicts[case.name]
    assert verdict.status is case.expect, f"{verdict.reason}\n{verdict.details}"
    assert case.reason in verdict.reason, verdict.reason
    if case.expect is not UNVERIFIED:
        assert verdict.details["reference"] == case.reference, verdict.details
    if case.expect is FAILED:
        assert "input_source" in verdict.details
        assert verdict.details.get("mismatch") or "rewrite" in verdict.reason


def test_a_mismatch_reports_where_how_much_and_the_shapes(verdicts: dict) -> None:
    mismatch = verdicts["idiomatic_divide_by_len"].details["mismatch"]
    assert mismatch["path"] == "output" and mismatch["shape"] == [8, 4]
    assert mismatch["max_abs_err"] > 0.1 and mismatch["max_rel_err"] > 0.1


def test_a_verified_site_states_its_inputs_and_errors(verdicts: dict) -> None:
    details = verdicts["faithful_divide_by_len"].details
    assert details["input_source"] == "synthesized"
    assert details["input_shapes"] == ["float32[8, 4]"]
    assert details["max_abs_err"] <= 1e-5
    assert verdicts["nested_pmap"].details["input_source"] == "declared"
    details = verdicts["pjit_to_jit_with_set_mesh"].details
    assert details["contexts"] == ["entered `mesh`"]
    assert details["candidate_contexts"] == ["entered `jax.set_mesh(mesh)`"]


def test_the_mesh_size_comes_from_the_calls(verdicts: dict) -> None:
    details = verdicts["four_of_eight_devices"].details
    assert details["mapped_axis_size"] == 4
    assert details["mesh_hint"] == "the calls map 4 of 8 devices: the mesh needs 4"
    assert "mesh_hint" not in verdicts["faithful_divide_by_len"].details


def test_the_idiomatic_alternative_is_verified_only_where_it_is_right(verdicts: dict) -> None:
    offered = verdicts["faithful_elementwise"].details["alternative"]
    assert offered["status"] == "verified", offered
    for name in ("divide_by_len", "outer", "scalar_sum"):
        refused = verdicts[f"faithful_{name}"].details["alternative"]
        assert refused["status"] == "failed", (name, refused)
    assert "alternative" not in verdicts["idiomatic_outer"].details
