"""When the program-level pmap form is not taken, and why: the faithful form with the reason.

The positive cases run as fixture pairs (tests/fixtures/pmap/program_*.py, executed on 8 CPU
devices); these are the shapes the analysis must refuse, checked through the real engine.
"""

from __future__ import annotations

import runpy
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pmap"

HEAD = """\
import jax
import jax.numpy as jnp


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i")


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
"""

REFUSED = {
    "returned stacked": (
        "    w = p_step(w, x)\n    return w\n",
        "returned by `main` with its device axis",
    ),
    "returned in a tuple": (
        "    w = p_step(w, x)\n    return w, 1\n",
        "returned by `main` with its device axis",
    ),
    "called in a nested def": (
        "    def later():\n        out = p_step(w, x)\n        return out[0]\n\n    return later()\n",
        "nested function",
    ),
    "called in a lambda": ("    f = lambda: p_step(w, x)\n    return f()[0]\n", "nested function"),
    "handed to other code": ("    return run(p_step, w, x)\n", "used other than called"),
    "read as a whole": ("    out = p_step(w, x)\n    return out.sum()\n", "read other than"),
    "argument from a parameter": (
        "    w = p_step(w, x)\n    v = p_step(w, y)\n    return v[0]\n",
        "not visible",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_shapes_keep_the_faithful_form_and_say_why(case: str) -> None:
    tail, why = REFUSED[case]
    result = migrate_source(HEAD + tail, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code
    (site,) = result.sites
    assert "program-level form not taken" in site.message and why in site.message, site.message


def test_the_same_flow_taken_when_fully_visible() -> None:
    code = HEAD + "    w = p_step(w, x)\n    return w[0]\n"
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "jax.shard_map(" in result.code
    assert "return w\n" in result.code
    assert len({s.group for s in result.sites}) == 1 and len(result.sites) == 4


def test_faithful_style_never_takes_it() -> None:
    code = HEAD + "    w = p_step(w, x)\n    return w[0]\n"
    result = migrate_source(code, options=Options(unsafe_fixes=True, pmap_style="faithful"))
    assert "shard_map_per_device(" in result.code
    assert "program-level" not in result.sites[0].message


def test_a_group_is_written_whole_or_not_at_all() -> None:
    code = HEAD + "    w = p_step(w, x)\n    return w[0]\n"

    def refuse_the_readback(sites):
        return [
            s if "readback" not in s.message else type(s)(**{**vars(s), "applied": False})
            for s in sites
        ]

    result = migrate_source(code, options=Options(unsafe_fixes=True), accept=refuse_the_readback)
    assert result.code == code
    assert not any(s.applied for s in result.sites)


def run_main(source: str, *args: object) -> object:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "program.py"
        path.write_text(source)
        namespace = runpy.run_path(str(path), run_name="program")
    return jax.device_get(namespace["main"](*args))


def assert_taken_and_equal(source: str) -> str:
    """Migrate `source`: the program-level form only, and `main(w, x)` gives the same values."""
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device" not in result.code and "jax.shard_map(" in result.code
    assert not any("not taken" in s.message for s in result.sites), result.sites
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3,)).astype(np.float32)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    before, after = run_main(source, w, x), run_main(result.code, w, x)
    assert jax.tree.structure(before) == jax.tree.structure(after)
    for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        assert type(old) is type(new) and np.shape(old) == np.shape(new)
        np.testing.assert_allclose(old, new, rtol=1e-6)
    return result.code


# Device 0's copy read back and fetched to the host, as realistic programs do.
READBACKS = {
    "fetched after unreplicate": "    w = jax.device_get(jax_utils.unreplicate(w))\n    return w\n",
    "fetched device 0": "    return np.asarray(w[0])\n",
    "copied per leaf": "    w = jax.tree.map(lambda v: np.array(v[0]), w)\n    return w\n",
    "copied per leaf, returned": "    return jax.tree.map(lambda v: np.asarray(v[0]), w)\n",
    "fetched per leaf": "    w = jax.tree.map(lambda v: jax.device_get(v[0]), w)\n    return w\n",
}


@pytest.mark.parametrize("case", sorted(READBACKS))
def test_readbacks_fetched_to_the_host_are_deleted(case: str) -> None:
    head = "import numpy as np\nfrom flax import jax_utils\n" + HEAD
    code = assert_taken_and_equal(head + "    w = p_step(w, x)\n" + READBACKS[case])
    assert "[0]" not in code and "unreplicate" not in code
    if case == "fetched per leaf":  # `jax.device_get` maps over the tree itself
        assert "w = jax.device_get(w)\n" in code, code


FLAT_HEAD = """\
import jax
import jax.numpy as jnp
import numpy as np


def step(w, x):
    return x * w


def tohost(x):
    n_device, n_batch, *rest = x.shape
    return np.array(x).reshape((n_device * n_batch,) + tuple(rest))


def stacked(x):
    return np.array(x)


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    out = p_step(w, x)
"""


def test_a_module_helper_flattening_a_result_is_deleted() -> None:
    code = assert_taken_and_equal(FLAT_HEAD + "    return tohost(out)\n")
    assert "return np.array(\n" in code or "return np.array(multihost" in code, code


@pytest.mark.parametrize(
    "tail",
    [
        "    return stacked(out)\n",  # a helper that keeps the device axis
        "    tohost = stacked\n    return tohost(out)\n",  # the name is another function here
    ],
)
def test_a_module_helper_not_flattening_a_result_is_refused(tail: str) -> None:
    result = migrate_source(FLAT_HEAD + tail, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code
    message = next(s.message for s in result.sites if "`jax.pmap`" in s.message)
    assert "program-level form not taken" in message and "read other than flattened" in message


@pytest.mark.parametrize("start", ["ws, other = [], []", "other, ws = [1], []", "[ws] = [[]]"])
def test_lists_started_together_gather_results(start: str) -> None:
    head = "from flax.training import common_utils\n" + HEAD
    tail = f"    {start}\n    for _ in range(2):\n        w = p_step(w, x)\n        ws.append(w)\n"
    code = assert_taken_and_equal(head + tail + "    return common_utils.get_metrics(ws)\n")
    assert "stack_forest(jax.device_get(ws))" in code


def test_a_list_started_from_another_value_is_refused() -> None:
    tail = "    ws, other = [None], []\n    w = p_step(w, x)\n    ws.append(w)\n    return ws\n"
    result = migrate_source(HEAD + tail, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code
    message = next(s.message for s in result.sites if "`jax.pmap`" in s.message)
    assert "program-level form not taken" in message and "`ws`" in message, message


PAIR_HEAD = """\
import jax
import jax.numpy as jnp


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i"), jax.lax.psum(x.sum(), "i")


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
"""


def test_results_unpacked_in_the_next_statement_are_followed() -> None:
    tail = "    for _ in range(2):\n        outputs = p_step(w, x)\n        w, total = outputs\n"
    code = assert_taken_and_equal(PAIR_HEAD + tail + "    return w[0], total[0]\n")
    assert "w, total = outputs\n" in code and "return w, total\n" in code


@pytest.mark.parametrize(
    "tail",
    [
        "    outputs = p_step(w, x)\n    w, total = outputs\n    return w[0], outputs\n",
        "    outputs = p_step(w, x)\n    v = 1\n    w, total = outputs\n    return w[0], total[0]\n",
    ],
)
def test_results_unpacked_other_than_next_are_refused(tail: str) -> None:
    result = migrate_source(PAIR_HEAD + tail, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code


DICT_HEAD = """\
import jax
import jax.numpy as jnp


def step(w, x):
    out = {"l2": jax.lax.pmean(jnp.sum(x**2), "i"), "w": jnp.sum(w)}
    return w - jax.lax.pmean(x.mean(0) * w, "i"), out


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w, measurements = p_step(w, x)
    log = {}
"""

ITEMS = {
    "items": "    for name, value in measurements.items():\n        log[name] = float(value[0])\n",
    "values": "    for value in measurements.values():\n        log[len(log)] = value[0] * 2\n",
}


@pytest.mark.parametrize("case", sorted(ITEMS))
def test_a_dict_of_results_read_in_a_loop_over_its_items(case: str) -> None:
    code = assert_taken_and_equal(DICT_HEAD + ITEMS[case] + "    return w[0], log\n")
    assert "value[0]" not in code


def test_the_loop_variable_may_be_another_loops_name_elsewhere() -> None:
    """big_vision: `for name, value in measurements.items(): ... value[0]`, and later
    `for key, value in evaluator.run(...)`: each read is taken by the binding reaching it."""
    other = "    for key, value in [('a', 1)]:\n        log[key] = value\n    value = 2\n"
    code = assert_taken_and_equal(DICT_HEAD + ITEMS["items"] + other + "    return w[0], log\n")
    assert "value[0]" not in code


@pytest.mark.parametrize(
    "loop",
    [
        "    for name, value in measurements.items():\n        log[name] = value\n",
        "    for name, value in measurements.items():\n        log[name] = value[0]\n    log[0] = value\n",
        "    for name, value in measurements.items():\n        log[name] = value[1]\n",
    ],
)
def test_items_read_other_than_as_device_0_are_refused(loop: str) -> None:
    source = DICT_HEAD + loop + "    return w[0], log\n"
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code


TUPLE_HEAD = """\
import jax
import jax.numpy as jnp
import numpy as np


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i"), jax.lax.pmean(jnp.sum(x), "i"), x.sum(0)


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w, total, mine = p_step(w, x)
"""


def test_a_readback_of_a_tuple_of_values_the_same_on_every_device_is_deleted() -> None:
    """big_vision's distill: `jax.tree_map(lambda x: np.array(x[0]), (params["student"],
    opt))`, every item the same on every device."""
    tail = "    w_cpu, total_cpu = jax.tree.map(lambda v: np.array(v[0]), (w, total))\n"
    code = assert_taken_and_equal(TUPLE_HEAD + tail + "    return w_cpu, total_cpu\n")
    assert "np.array(v)" in code and "(w, total)" in code


def test_a_readback_of_a_tuple_holding_a_per_device_result_is_refused() -> None:
    tail = "    w_cpu, mine_cpu = jax.tree.map(lambda v: np.array(v[0]), (w, mine))\n"
    result = migrate_source(
        TUPLE_HEAD + tail + "    return w_cpu, mine_cpu\n", options=Options(unsafe_fixes=True)
    )
    assert "shard_map_per_device(" in result.code


SINK = """
class Sink:
    def take(self, values):
        return jax.tree.map(lambda v: np.asarray(v).sum(0), values)

"""


def test_a_literal_of_replicated_values_passed_to_code_not_followed_is_copied_whole() -> None:
    """uvim's `evaluator.run({"params": params_repl, "task_params": task_params})`."""
    head = TUPLE_HEAD.replace("\n\ndef step(", SINK + "\ndef step(")
    tail = "    got = Sink().take({'w': w, 'total': total})\n    return w[0], got\n"
    code = assert_taken_and_equal(head + tail)
    assert "Sink().take(device_copies({'w': w, 'total': total}))" in code


def test_a_literal_holding_a_per_device_result_passed_to_code_not_followed_is_refused() -> None:
    head = TUPLE_HEAD.replace("\n\ndef step(", SINK + "\ndef step(")
    tail = "    got = Sink().take({'w': w, 'mine': mine})\n    return w[0], got\n"
    result = migrate_source(head + tail, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code


# Parts taken from a batch drawn from an iterator not seen into are batches as the whole is
# (fixture `program_drawn_batches_taken_apart`); a part of anything else keeps its layout unknown.
TAKEN_HEAD = """\
import jax


def step(w, x):
    return w - jax.lax.pmean(x.mean(0), "i")


def main(w, batches, config):
    p_step = jax.pmap(step, axis_name="i")
    w = jax.numpy.broadcast_to(w, (jax.local_device_count(),) + w.shape)
    for batch in batches:
"""
TAKEN = {
    "popped": ("        x = batch.pop('x')\n", True),
    "subscript in a tuple": ("        x, y = batch['x'], batch['y']\n", True),
    "got": ("        x = batch.get('x')\n", True),
    "a part of a part": ("        inner = batch['inner']\n        x = inner['x']\n", True),
    "popped from a parameter": ("        x = config.pop('x')\n", False),
    "a part of a value rebound from a parameter": (
        "        batch = config\n        x = batch['x']\n",
        False,
    ),
    "a part of a value drawn on one path only": (
        "        if config:\n            batch = config\n        x = batch['x']\n",
        False,
    ),
    "unpacked from an unequal tuple": ("        x, y = batch['x'], batch['y'], 1\n", False),
    "popped with a default": ("        x = batch.pop('x', None)\n", False),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_parts_of_a_drawn_batch_are_batches(case: str) -> None:
    line, taken = TAKEN[case]
    code = TAKEN_HEAD + line + "        w = p_step(w, x)\n    return w[0]\n"
    result = migrate_source(code, options=Options(unsafe_fixes=True))
    messages = [s.message for s in result.sites]
    assert ("shard_map_per_device(" not in result.code) is taken, messages
    if taken:
        assert "global_batch(x, " in result.code
        assert any("a part of `batch`, a loop variable over `batches`" in m for m in messages)
    else:
        assert "[PL301]" in messages[0] and "`x`" in messages[0], messages


LIST_READBACK = """\
import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils


def step(w, x):
    return {"loss": jax.lax.psum(jnp.sum(x @ w), "i"), "own": jnp.sum(x @ w)}


def main(w, batches):
    p_step = jax.pmap(step, axis_name="i")
    w = jax_utils.replicate(w)
    metrics = []
    for x in batches:
        out = p_step(w, x)
        metrics.append(out)
    metrics = jax.device_get(jax.tree.map(lambda v: v[0], metrics))
    return [m["loss"] for m in metrics]
"""


def test_a_list_of_results_rebound_by_its_readback_is_read_back_at_once() -> None:
    replicated = LIST_READBACK.replace(', "own": jnp.sum(x @ w)', "")
    result = migrate_source(replicated, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" not in result.code, [s.message for s in result.sites]
    assert "metrics = jax.device_get(metrics)" in result.code
    # a result differing between devices in the list: device 0's own share, not one value
    result = migrate_source(LIST_READBACK, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code
    assert "[PL402]" in result.sites[0].message, result.sites[0].message


STORED = """\
import jax
from flax import jax_utils


def step(w, x):
    return w - jax.lax.pmean(x.mean(0), "i")


class Trainer:
    def __init__(self):
        self.step = jax.pmap(step, axis_name="i")

    def fit(self, w, batches):
        w = jax_utils.replicate(w)
        for x in batches:
            w = self.step(w, x)
        return w[0]
"""
STORED_REFUSED = {
    "read in the method storing it": (
        "        self.step = jax.pmap(",
        "        self.step = self.step or jax.pmap(",
    ),
    "read outside the class": (
        "        return w[0]\n",
        "        return w[0]\n\n\ndef peek(t):\n    return t.step\n",
    ),
    "called in two methods": (
        "        return w[0]\n",
        "        return w[0]\n\n    def again(self, w, x):\n        return self.step(w, x)[0]\n",
    ),
    "stored again elsewhere": (
        "        return w[0]\n",
        "        return w[0]\n\n    def reset(self):\n        self.step = None\n",
    ),
}


def test_a_step_stored_on_self_is_taken_in_the_one_method_calling_it() -> None:
    result = migrate_source(STORED, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" not in result.code, [s.message for s in result.sites]
    assert (
        "self.step = jax.jit(" in result.code and "w = self.step(w, global_batch(x, " in result.code
    )


@pytest.mark.parametrize("case", sorted(STORED_REFUSED))
def test_a_step_stored_on_self_read_elsewhere_keeps_the_faithful_form(case: str) -> None:
    old, new = STORED_REFUSED[case]
    assert old in STORED
    result = migrate_source(STORED.replace(old, new), options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code, case


def test_a_public_factory_of_a_stored_step_keeps_the_faithful_form() -> None:
    source = (
        (FIXTURES / "program_stored_factory_step.py")
        .read_text()
        .replace("_get_eval_fn", "get_eval_fn")
    )
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "shard_map_per_device(" in result.code  # code elsewhere may call `get_eval_fn`
    assert "[PL201]" in result.sites[0].message, result.sites[0].message


def test_a_stored_step_not_taken_is_diagnosed_with_the_declared_parameters() -> None:
    two = STORED.replace("        w = jax_utils.replicate(w)\n", "").replace(
        "        return w[0]\n",
        "        return w[0]\n\n    def again(self, w, x):\n        return self.step(w, x)[0]\n",
    )
    plain = migrate_source(two, options=Options(unsafe_fixes=True)).sites[0].message
    assert "[PL301]" in plain and "`w`, a parameter of `fit`" in plain, plain
    declared = Options(unsafe_fixes=True, pmap_replicated=("Trainer.fit(w)", "Trainer.again(w)"))
    message = migrate_source(two, options=declared).sites[0].message
    # `w` is the declared copies now, joined in the loop with the step's results (the same
    # layout): what blocks is the batch `again` is given, `x`, which no entry declares
    assert "`w`, a parameter" not in message, message
    assert "[PL301]" in message and "`x`, a parameter of `again`" in message, message


@pytest.mark.parametrize(
    ("case", "args", "tail"),
    [
        ("program_static_step", ["replicated", "batch", "batch", "fixed", "static"], False),
        ("program_static_star_args_tail", ["replicated", "batch"], True),
    ],
)
def test_the_verifier_is_told_which_arguments_are_static(
    case: str, args: list[str], tail: bool
) -> None:
    """A static position is "static" in the layout the verifier gets, and a static `*args`
    tail is `static_tail`: its adapters pass them to the rewrite's step as they are."""
    path = Path(__file__).parent / "fixtures" / "pmap" / f"{case}.py"
    result = migrate_source(path.read_text(), options=Options(unsafe_fixes=True))
    (layout,) = [s.details["layout"] for s in result.sites if "layout" in s.details]
    assert layout["args"] == args and layout["static_tail"] is tail


def test_a_def_a_step_is_passed_to_is_rewritten_where_it_is_bound_last() -> None:
    # Two module-level defs named `evaluate`: the callers call the last; the first, rebound before
    # anyone calls it, is left as it is written.
    source = (FIXTURES / "program_passed_to_def.py").read_text()
    first = "def evaluate(*, p_eval_step, params, batches):\n    return params\n\n\n"
    assert source.count("\ndef evaluate(") == 1
    twice = source.replace("\ndef evaluate(", "\n" + first + "def evaluate(", 1)
    once = migrate_source(source, options=Options(unsafe_fixes=True))
    result = migrate_source(twice, options=Options(unsafe_fixes=True))
    assert first in result.code, result.code
    assert result.code.replace(first, "", 1) == once.code  # the last one rewritten as before
