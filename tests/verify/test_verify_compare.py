"""The comparison rules on host values (numpy only, no workers)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jaxmigrate.verify.child.compare import compare, has_values, max_errors, tolerance
from jaxmigrate.verify.child.values import Flat, HostKey, Node, Opaque


def flat(*leaves, treedef="PyTreeDef((*, *))") -> Flat:
    return Flat(treedef, tuple((f"[{i}]", leaf) for i, leaf in enumerate(leaves)))


def test_equal_outputs_agree() -> None:
    a = flat(np.arange(4, dtype=np.float32), np.array([1, 2], np.int32))
    assert compare(a, a) is None
    assert max_errors(a, a) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("dtype", "rel", "agree"),
    [
        (np.float32, 1e-6, True),
        (np.float32, 1e-4, False),
        (np.float64, 1e-10, True),
        (np.float64, 1e-7, False),
        (ml_dtypes.bfloat16, 1e-2, True),
        (ml_dtypes.bfloat16, 1e-1, False),
        (np.float16, 1e-3, True),
        (np.float16, 1e-2, False),
    ],
)
def test_float_tolerance_depends_on_the_dtype(dtype, rel: float, agree: bool) -> None:
    ref = np.linspace(1, 2, 16).astype(dtype)
    new = (ref.astype(np.float64) * (1 + rel)).astype(dtype)
    assert (compare(flat(ref), flat(new)) is None) is agree


def test_a_mismatch_names_path_errors_and_shape() -> None:
    ref = np.ones((8, 5), np.float32)
    new = ref.copy()
    new[3, 2] = 1.5
    found = compare(flat(ref, ref), flat(ref, new))
    assert found["path"] == "output[1]" and found["shape"] == [8, 5]
    assert found["max_abs_err"] == pytest.approx(0.5) and found["max_rel_err"] == pytest.approx(0.5)


def test_shapes_dtypes_and_structure_must_match_exactly() -> None:
    ref = np.zeros((8, 4), np.float32)
    assert "shape [4], expected [8, 4]" in compare(flat(ref), flat(np.zeros(4, np.float32)))["why"]
    assert "dtype float64" in compare(flat(ref), flat(ref.astype(np.float64)))["why"]
    other = flat(ref, treedef="PyTreeDef([*, *])")
    assert "pytree structure" in compare(flat(ref), other)["why"]


def test_integers_bools_and_keys_are_exact() -> None:
    assert (
        compare(flat(np.array([1, 2])), flat(np.array([1, 3])))["why"]
        == "1 of 2 exact values differ"
    )
    assert compare(flat(np.array([True])), flat(np.array([False]))) is not None
    key = HostKey(np.array([[0, 1]], np.uint32), "threefry2x32")
    assert compare(flat(key), flat(key)) is None
    other = HostKey(np.array([[0, 2]], np.uint32), "threefry2x32")
    assert "PRNG key data" in compare(flat(key), flat(other))["why"]
    assert "a PRNG key on one side only" in compare(flat(key), flat(key.data))["why"]


def test_nans_must_be_in_the_same_places() -> None:
    ref = np.array([np.nan, 1.0], np.float32)
    assert compare(flat(ref), flat(ref.copy())) is None
    assert compare(flat(ref), flat(np.array([1.0, 1.0], np.float32))) is not None


def test_other_leaves_compare_by_value() -> None:
    assert compare(flat(3, "a"), flat(3, "a")) is None
    assert compare(flat(3), flat(4))["why"] == "4, expected 3"


def test_an_opaque_value_never_fails_and_says_why_it_was_not_compared() -> None:
    notes: list[str] = []
    same = Opaque("<function f at 0x1>", "function m.f")
    assert compare(flat(same), flat(Opaque("<function f at 0x2>", "function m.f")), notes) is None
    assert notes == []
    no_key = Opaque("<Obj at 0x7f>", None, "a m.Obj shown only by its address")
    assert compare(flat(no_key), flat(no_key), notes) is None
    assert notes == ["output[0]: not comparable: a m.Obj shown only by its address"]
    other = Opaque("<function g>", "function m.g")
    assert compare(flat(same), flat(other), notes) is None
    assert "function m.g, reference function m.f" in notes[-1]
    assert not has_values(flat(same)) and has_values(flat(same, 3)) and has_values(flat())
    assert "expected ndarray" in compare(flat(np.ones(2)), flat(same))["why"]


def node(kind: str, children: dict, aux: object = None) -> Node:
    return Node(kind, aux, tuple(children.items()))


def structured(tree: Node, *leaves: object) -> Flat:
    return Flat("ignored", tuple((f"[{i}]", leaf) for i, leaf in enumerate(leaves)), tree)


def test_structure_compares_node_types_keys_and_static_data() -> None:
    fn = Opaque("<function apply at 0x1>", "function model.apply")
    state = node("m.TrainState", {".params": None, ".step": None}, (fn, "tag"))
    ref = structured(state, np.ones(2), 1)
    assert compare(ref, structured(state, np.ones(2), 1)) is None
    moved = Opaque("<function apply at 0x2>", "function model.apply")
    same = node("m.TrainState", {".params": None, ".step": None}, (moved, "tag"))
    assert compare(ref, structured(same, np.ones(2), 1)) is None
    renamed = node("m.Other", {".params": None, ".step": None}, (fn, "tag"))
    why = compare(ref, structured(renamed))["why"]
    assert why == "pytree structure: node type m.Other, expected m.TrainState"
    fewer = node("m.TrainState", {".params": None}, (fn, "tag"))
    assert "children missing ['.step']" in compare(ref, structured(fewer))["why"]
    tagged = node("m.TrainState", {".params": None, ".step": None}, (fn, "other"))
    assert "static data 'other', expected 'tag'" in compare(ref, structured(tagged))["why"]
    nested = node("builtins.dict", {"['a']": state})
    deeper = node("builtins.dict", {"['a']": fewer})
    assert compare(structured(nested), structured(deeper))["path"] == "output['a']"


def test_large_magnitudes_scale_the_absolute_tolerance() -> None:
    rtol, atol = tolerance(np.dtype(np.float32))
    ref = np.array([1e6, 0.0], np.float32)
    assert compare(flat(ref), flat(np.array([1e6, 0.5], np.float32))) is None
    assert compare(flat(ref), flat(np.array([1e6, 50.0], np.float32))) is not None
    assert (rtol, atol) == (1e-5, 1e-6)


def test_python_floats_read_off_float32_results_agree_as_float32_values() -> None:
    # `float(loss)` of a float32 mean, summed in two orders: one float32 step apart
    ref = float(np.float32(0.7312459))
    new = float(np.nextafter(np.float32(ref), np.float32(1.0)))
    assert ref != new
    assert compare(flat(ref), flat(new)) is None
    # a float64 computation (not a float32 value) keeps float64's tolerance
    wide_ref = ref + 1e-12
    assert compare(flat(wide_ref), flat(new)) is not None
    # and float32 values differing beyond float32's tolerance still differ
    far = float(np.float32(ref * (1 + 1e-4)))
    found = compare(flat(ref), flat(far))
    assert found is not None and "values differ" in found["why"]
    # NaN against NaN agrees; an overflowing float64 is no float32 value
    assert compare(flat(float("nan")), flat(float("nan"))) is None
    assert compare(flat(1e300), flat(1e300 * (1 + 1e-7))) is not None


def test_a_python_number_of_the_inputs_stands_for_the_array_holding_it() -> None:
    # flax's `TrainState.step`, `0`: device 0's copy of the replicated original, `int32[]`,
    # and the rewrite's own Python number, whose replication the program-level form deleted
    step = np.asarray(np.arange(8, dtype=np.int32) * 0)[0]
    assert compare(flat(step), flat(0), inputs=True) is None
    assert compare(flat(np.array(0.5, np.float32)), flat(0.5), inputs=True) is None
    # outputs stay exact about types, and inputs about values and axes
    assert compare(flat(step), flat(0)) is not None
    assert compare(flat(step), flat(1), inputs=True) is not None
    assert compare(flat(np.array([0], np.int32)), flat(0), inputs=True) is not None
    assert compare(flat(np.array(0.1, np.float32)), flat(0.1), inputs=True) is not None
