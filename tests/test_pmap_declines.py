"""Every reason the program-level pmap form is not taken is a stable code (`Decline`), listed in
the rule's `## Skips` and pinned by a fixture; the message names the value that blocks."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import codemods.pmap
from codemods.pmap import Pmap
from codemods.pmap._declines import Decline
from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source

FIXTURES = Path(__file__).parent / "fixtures" / "pmap"
PINNED_BY_TEST = {Decline.VERIFICATION}  # needs a verification result: pinned below

PROGRAM = """\
import jax
import jax.numpy as jnp


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i")


def main(w, x):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w = p_step(w, x)
    return w[0]
"""


def pmap_messages(source: str, **kwargs) -> list[str]:
    result = migrate_source(source, options=Options(unsafe_fixes=True), **kwargs)
    return [
        s.message
        for s in result.sites
        if s.code == Pmap.CODE and s.message.startswith("`jax.pmap` ->")
    ]


def test_codes_are_stable_and_unique():
    values = [d.value for d in Decline]
    assert len(values) == len(set(values))
    assert all(re.fullmatch(r"PL[1-6]\d\d", v) for v in values), values


@pytest.mark.parametrize("decline", list(Decline), ids=lambda d: d.value)
def test_every_code_is_documented_and_pinned(decline: Decline):
    assert f"`{decline.value}`" in (codemods.pmap.__doc__ or ""), "listed in the rule's `## Skips`"
    if decline in PINNED_BY_TEST:
        return
    pinned = [
        p.name for p in FIXTURES.glob("*.messages.txt") if f"[{decline.value}]" in p.read_text()
    ]
    assert pinned, f"no fixture pins {decline.value}"


def test_a_program_that_failed_verification_falls_back_with_its_code():
    (first,) = pmap_messages(PROGRAM)
    assert "(program-level)" in first, first
    group = f"{Pmap.CODE}:program:11:14"  # the step's original position
    messages = pmap_messages(PROGRAM, fallbacks={group: "outputs differ"})
    assert any(
        "[PL603] program-level form failed verification (outputs differ)" in m for m in messages
    ), messages


def test_an_argument_from_elsewhere_is_named_with_where_it_comes_from():
    source = PROGRAM.replace("    w = jnp.broadcast_to(w, (n,) + w.shape)\n", "")
    (message,) = pmap_messages(source)
    assert "[PL301] argument 1 of the step comes from elsewhere" in message, message
    assert "(`w`, a parameter of `main`)" in message, message  # its value reaches the call
    source = PROGRAM.replace("x.reshape((n, -1) + x.shape[1:])", "load(x)")
    (message,) = pmap_messages(source)
    assert "argument 2 of the step comes from elsewhere (`x` = `load(x)`)" in message, message


def test_a_step_made_under_main_is_followed_in_that_block():
    """The `__main__` block is the program's host: its values are followed as a function's;
    one coming from outside the block as it is blocks (PL301, named)."""
    source = PROGRAM.replace("def main(w, x):", 'if __name__ == "__main__":').replace(
        "    return w[0]\n", "    print(w[0])\n"
    )
    (message,) = pmap_messages(source)
    assert "(program-level)" in message, message
    (message,) = pmap_messages(source.replace("    w = jnp.broadcast_to(w, (n,) + w.shape)\n", ""))
    assert (
        "[PL301] argument 1 of the step comes from elsewhere (`w`, a global bound outside the "
        "`__main__` block)"
    ) in message, message


def test_a_main_block_keeps_the_globals_a_def_of_the_module_reads():
    """`n = jax.local_device_count()` is dropped once the rewrite reads it no more, but not from
    a `__main__` block when a def of the module reads the global `n`."""
    source = PROGRAM.replace("def main(w, x):", 'if __name__ == "__main__":').replace(
        "    return w[0]\n", "    print(w[0], devices())\n"
    )
    source = source.replace(
        "    n = jax", "    w, x = jnp.ones(3), jnp.ones((16, 3))\n    n = jax"
    ).replace("def step(", "def devices():\n    return n\n\n\ndef step(")
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "(program-level)" in " ".join(s.message for s in result.sites)
    assert "    n = jax.local_device_count()\n" in result.code
    assert (
        "    n = jax.local_device_count()\n"
        not in migrate_source(
            source.replace("return n\n", "return 1\n"), options=Options(unsafe_fixes=True)
        ).code
    )


NLP_SEQ = """\
import jax
import jax.numpy as jnp
from flax.training import common_utils


def train_step(w, batch):
    metrics = {"loss": jnp.sum(batch)}  # not reduced over the devices
    return w - jax.lax.pmean(jnp.mean(batch, 0) * w, "batch"), metrics


def eval_step(w, batch):
    return {"loss": jnp.sum(batch * w)}


def main(data):
    w = jax.numpy.ones(3)
    w = jax.numpy.stack([w] * jax.local_device_count())
    p_train_step = jax.pmap(train_step, axis_name="batch")
    p_eval_step = jax.pmap(eval_step, axis_name="batch")
    metrics_all = []
    for batch in data:
        batch = common_utils.shard(batch)
        w, metrics = p_train_step(w, batch)
        metrics_all.append(metrics)
    eval_metrics = []
    for batch in data:
        batch = common_utils.shard(batch)
        metrics = p_eval_step(w, batch)
        eval_metrics.append(metrics)
    return common_utils.get_metrics(metrics_all), common_utils.get_metrics(eval_metrics)
"""


def test_a_name_two_steps_bind_is_followed_where_each_binding_reaches():
    """flax nlp_seq binds `metrics` to both steps' results: each step's reads are the ones its
    binding reaches, so the message names what blocks (metrics not reduced: PL402), not
    `metrics` holding two values (PL401)."""
    messages = pmap_messages(NLP_SEQ)
    assert len(messages) == 2
    for message in messages:
        assert "[PL402] `metrics`, a result of `p_" in message, message


FACTORY = """\
import functools

import jax


@functools.lru_cache(None)
def get_eval_fn(predict_fn):
    @functools.partial(jax.pmap, axis_name="batch")
    def _eval_fn(params, batch):
        return jax.lax.psum(predict_fn(params, batch), "batch")

    return _eval_fn
"""


def test_a_step_used_as_a_value_says_where_it_goes():
    (message,) = pmap_messages(FACTORY)  # big_vision's evaluators: a cached factory
    assert "[PL201] `_eval_fn` is used other than called: returned by `get_eval_fn`" in message
    source = FACTORY.replace("    return _eval_fn\n", "    return evaluate(_eval_fn)\n")
    (message,) = pmap_messages(source)
    assert "`_eval_fn` is used other than called: passed to `evaluate(...)`" in message, message
    stored = (
        FACTORY
        + """

class Evaluator:
    def __init__(self, predict_fn):
        self.eval_fn = get_eval_fn(predict_fn)

    def run(self, params, batches):
        for batch in batches:
            out = self.eval_fn(params, batch)
            yield out[0]
"""
    )
    (message,) = pmap_messages(stored)  # followed to where it is called: what blocks it there
    assert (
        "[PL301] the step is returned by `get_eval_fn`, and the step stored in `self.eval_fn` is "
        "called in `Evaluator.run`: argument 1 of the step comes from elsewhere (`params`, a "
        "parameter of `run`"
    ) in message, message


def test_a_step_stored_on_self_names_the_attribute():
    source = """\
import jax


class Evaluator:
    def __init__(self, predict):
        self._count_p = jax.pmap(lambda m: jax.lax.psum(m.sum(), "i"), axis_name="i")
"""
    (message,) = pmap_messages(source)  # big_vision's image_text evaluators
    assert "[PL205] `self._count_p` is not called in `Evaluator`" in message, message


def test_batches_from_another_modules_iterator_are_converted_where_passed():
    source = """\
import functools

import flax
import jax
from big_vision import input_pipeline


def main(params, train_ds, steps):
    @functools.partial(jax.pmap, axis_name="batch")
    def update_fn(params, images):
        return params - jax.lax.pmean(images.mean(), "batch")

    params = flax.jax_utils.replicate(params)
    train_iter = input_pipeline.start_input_pipeline(train_ds, 1)
    for step, batch in zip(range(1, steps + 1), train_iter):
        params = update_fn(params, batch["image"])
    return params[0]
"""
    # big_vision's train.py and trainers: the batches were PL301 ("the layout of its batches
    # is that function's"); drawn from the pipeline, they are converted where passed, and the
    # message names the pipeline.
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    messages = [s.message for s in result.sites if s.code == Pmap.CODE]
    assert any("(program-level)" in m for m in messages), messages
    (converted,) = [m for m in messages if m.startswith("a batch drawn from")]
    assert (
        "`batch`, a loop variable over `train_iter` = `input_pipeline.start_input_pipeline("
        "train_ds, 1)` (`big_vision.input_pipeline.start_input_pipeline`)"
    ) in converted, converted
    assert 'update_fn(params, global_batch(batch["image"], batch_sharding))' in result.code
    assert "def global_batch(batch, sharding):" in result.code
    assert "input_pipeline.start_input_pipeline(train_ds, 1)" in result.code  # left as it was
    # the replication's statement is dropped; the blank line above it stays, after the def
    assert '"batch")\n\n    train_iter = input_pipeline' in result.code, result.code


def test_a_step_called_where_made_says_what_it_would_cost():
    source = """\
import jax
import jax.numpy as jnp


def _sync(x):
    return jax.lax.psum(x, "i")


def sync():
    x = jnp.ones([jax.local_device_count()])
    x = jax.device_get(jax.pmap(_sync, "i")(x))
    assert x[0] == jax.device_count()
"""
    (message,) = pmap_messages(source)  # big_vision's `u.sync()`
    assert (
        '[PL103] the step is called where it is made, `jax.pmap(_sync, "i")(x)`: made there as '
        "`jax.jit(jax.shard_map(...))`, it would be compiled again at every call of `sync`, "
        "where pmap compiles it once"
    ) in message, message
    lambda_body = source.replace("jax.pmap(_sync,", 'jax.pmap(lambda v: jax.lax.psum(v, "i"),')
    (message,) = pmap_messages(lambda_body)  # a new lambda each call: pmap compiles it again too
    assert message.endswith('made, `jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(x)`'), message


def test_a_step_made_in_a_class_body_names_the_method_and_where_its_result_goes():
    source = """\
import functools

import jax
from jax import lax

from algoperf import spec


class Workload(spec.Workload):
    @functools.partial(jax.pmap, axis_name="batch", static_broadcasted_argnums=(0,))
    def _eval_model(self, params, batch):
        return lax.psum((params * batch).sum(), "batch")

    def sync_batch_stats(self, model_state):
        avg_fn = jax.pmap(lambda x: lax.pmean(x, "x"), "x")
        return model_state.copy({"batch_stats": avg_fn(model_state["batch_stats"])})
"""
    evaluate, synchronize = pmap_messages(source)  # AlgoPerf's workloads
    assert (
        "[PL104] the step is made in a class body: its calls are not followed "
        "(`Workload._eval_model`, called as `self._eval_model(...)`, maybe in a base class)"
    ) in evaluate, evaluate
    assert (  # a mean over devices: the value itself only for equal copies, if they are
        "[PL301] `avg_fn` is a mean over devices, the value itself only for equal copies; its "
        'argument `model_state["batch_stats"]` comes from elsewhere (`model_state`, a parameter '
        "of `sync_batch_stats`)"
    ) in synchronize, synchronize
    alone = source.replace("class Workload(spec.Workload):", "class Workload:")
    assert (  # no base class: called, if at all, on an instance (jax's own tests)
        "(`Workload._eval_model`: no method of its class calls it, and it has no base class)"
    ) in pmap_messages(alone)[0]
    other = source.replace("lax.pmean(x, ", "lax.psum(x, ")  # not a mean: its result is read
    assert (
        "[PL401] the result of `avg_fn(...)` is read in `model_state.copy(...)`"
        in (pmap_messages(other)[1])
    )


def test_a_pmap_method_called_by_its_class_names_the_value_blocking_it():
    source = """\
import functools

import jax
from jax import lax


class _Workload:
    @functools.partial(jax.pmap, axis_name="batch", static_broadcasted_argnums=(0,))
    def _eval_model(self, params, batch):
        return lax.psum((params * batch).sum(), "batch")

    def _eval_model_on_split(self, params, batches):
        total = 0.0
        for batch in batches:
            total += self._eval_model(params, batch)[0]
        return total
"""
    (message,) = pmap_messages(source)  # AlgoPerf's workloads: `params` from the runner
    assert message.endswith(
        "[PL301] the step stored in `self._eval_model` is called in "
        "`_Workload._eval_model_on_split`: argument 1 of the step comes from elsewhere "
        "(`params`, a parameter of `_eval_model_on_split`): its layout is not visible; if every "
        "caller passes equal copies of one value, one per local device (not a batch split over "
        "the devices), the project can say so in `[tool.jaxmigrate]`: "
        '`pmap-replicated = ["_Workload._eval_model_on_split(params)"]`'
    ), message
    taken = source.replace(
        "total = 0.0", "params = jax_utils.replicate(params)\n        total = 0.0"
    )
    taken = taken.replace("from jax import lax", "from flax import jax_utils\nfrom jax import lax")
    (message,) = pmap_messages(taken)
    assert "(program-level)" in message, message
    public = taken.replace("_Workload", "Workload")  # a text alone: other modules may name it
    (message,) = pmap_messages(public)
    assert message.endswith(
        "[PL201] the step is a method of `Workload`, and its class `Workload` is used maybe by "
        "other modules (the code base is not read): its calls there are not followed"
    ), message
    unmapped = taken.replace("static_broadcasted_argnums=(0,)", "in_axes=(None, 0, 0)")
    assert pmap_messages(unmapped)[0].endswith(
        "[PL108] the step is a method of `_Workload`, and `self` is not a static argument of its pmap"
    )


def test_a_module_step_used_in_a_method_is_followed_there():
    source = """\
from functools import partial

import jax


@partial(jax.pmap, static_broadcasted_argnums=0, axis_name="batch")
def _run_predict_fn(predict_fn, params, batch):
    return jax.lax.psum(predict_fn(params, batch), axis_name="batch")


class Evaluator:
    def run(self, params, batch):
        out = _run_predict_fn(self.predict_fn, params, batch)
        return out[0]
"""
    (message,) = pmap_messages(source)  # big_vision's uvim compute_mean evaluator
    assert (
        "[PL301] argument 2 of the step comes from elsewhere (`params`, a parameter of `run`)"
    ) in message, message
    nested = source.replace("class Evaluator:", "def make():\n  class Evaluator:")
    for line in ("def run", "out = ", "return out"):
        nested = nested.replace(f"    {line}", f"      {line}")
    (message,) = pmap_messages(nested)  # a method of a class in a function: not followed
    assert "[PL202] `_run_predict_fn` is used outside the functions of the module" in message


def test_a_step_stored_on_self_is_followed_into_the_methods_calling_it():
    source = """\
import jax


class Evaluator:
    def __init__(self, predict_fn):
        def predict(params, batch):
            return jax.lax.all_gather(predict_fn(params, batch), axis_name="data", axis=0)

        self.predict_fn = jax.pmap(predict, axis_name="data")
        self._count_p = jax.pmap(lambda m: jax.lax.psum(m.sum(), self._axis), self._axis)

    def run(self, params, batches):
        for batch in batches:
            out = self.predict_fn(params, batch)
            yield out[0]
"""
    predict, count = pmap_messages(source)  # big_vision's uvim and image_text evaluators
    assert (
        "[PL301] the step stored in `self.predict_fn` is called in `Evaluator.run`: argument 1 "
        "of the step comes from elsewhere (`params`, a parameter of `run`"
    ) in predict, predict
    assert "[PL109] the mapped axis has no literal name (`self._axis`)" in count, count


EVALUATE = """\
import jax
import numpy as np


def step(w, x):
    return jax.lax.psum((w * x).sum(), "i")


p_step = jax.pmap(step, axis_name="i")


def evaluate(params, batches, fresh):
    if fresh:
        params = np.load("params.npy")
    total = 0.0
    for x in batches:
        total += p_step(params, x)[0]
    return total
"""
FRESH = '    if fresh:\n        params = np.load("params.npy")\n'


def test_a_parameter_blocking_alone_names_the_entry_declaring_it_and_that_entry_is_taken():
    """The message says how the project can declare what the callers pass, as the
    `pmap-replicated` entry it would write; declared, the site takes the program-level form."""
    (message,) = pmap_messages(EVALUATE.replace(FRESH, ""))
    assert "(`params`, a parameter of `evaluate`): its layout is not visible; " in message
    (entry,) = re.findall(r'`pmap-replicated = \["([^"]+)"\]`', message)
    assert entry == "evaluate(params)"
    declared = Options(unsafe_fixes=True, pmap_replicated=(entry,))
    result = migrate_source(EVALUATE.replace(FRESH, ""), options=declared)
    assert "params = from_device_copies(params)" in result.code
    assert result.sites[0].message.startswith("`jax.pmap` -> `jax.jit(jax.shard_map(...))`")


def test_no_entry_is_named_when_another_value_blocks_too():
    """`params` is the parameter on one path and a file's contents on the other: declaring the
    parameter would not make the argument's layout known."""
    (message,) = pmap_messages(EVALUATE)
    assert '(`params` = `np.load("params.npy")`; `params`, a parameter of `evaluate`)' in message
    assert "pmap-replicated" not in message


def test_a_public_factory_of_a_package_names_the_setting_that_closes_the_code_base(
    tmp_path: Path,
) -> None:
    """vision_transformer's `make_update_fn` in package `vit_jax`: code outside the code base
    may call it, and PL101 says which setting says none does; with it, the factory is followed."""
    from clitools import jm

    (tmp_path / "vj").mkdir()
    (tmp_path / "vj" / "__init__.py").write_text("")
    shutil.copyfile(FIXTURES / "decline_pl101_public_factory.py", tmp_path / "vj" / "train.py")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "vj"\n')
    args = ("run", "--dry-run", "--no-verify", "--no-cache", "--unsafe-fixes", ".")
    proc = jm(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "[PL101] the step is returned by `make_update_fn`, which is called from outside the code "
        "base maybe (`vj.train` is in package `vj`): those calls are not followed; "
        "`[tool.jaxmigrate] closed-code-base = true` says no code there does" in proc.stdout
    ), proc.stdout
    with (tmp_path / "pyproject.toml").open("a") as config:
        config.write("\n[tool.jaxmigrate]\nclosed-code-base = true\n")
    proc = jm(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[PL101]" not in proc.stdout and "(program-level)" in proc.stdout, proc.stdout


TUPLE_READ_BACK = """\
import jax
import jax.numpy as jnp
import numpy as np


def step(w, s, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i"), s + x.sum(0)


def main(w, s, x, h):
    n = jax.local_device_count()
    p_step = jax.pmap(step, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    s = jnp.broadcast_to(s, (n,) + s.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w, s = p_step(w, s, x)
    return jax.tree.map(lambda v: np.array(v[0]), ({}))
"""


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        # big_vision's vqvae: `(params_repl, opt_repl, state_repl)`, its state per device
        ("w, s", "[PL402] `s` is read back as device 0's copy with `w` (`jax.tree.map("),
        # a parameter of `main`, its copies not known to be equal
        ("w, h", "[PL401] `h` is read back as device 0's copy with `w` (`jax.tree.map("),
    ],
)
def test_a_tuple_read_back_names_the_item_that_is_not_surely_the_same(items, expected):
    """`jax.tree.map(lambda v: np.array(v[0]), (a, b))` is device 0's copy of each item: taken
    when every item is the same on every device; else the message names the item that blocks
    (it said "`w` ... passed to `jax.tree.map(...)`: what that does with it is not followed")."""
    (message,) = pmap_messages(TUPLE_READ_BACK.format(items))
    assert expected in message, message
    second = "it is a result that may differ" if "PL402" in expected else "not known to be equal"
    assert second in message, message


@pytest.mark.parametrize(
    "calls",
    [
        "",  # a factory no function of the module calls (private: no other module may)
        "\n\ndef main(x):\n    a = _make_step()\n    b = _make_step()\n    return a(x), b(x)\n",
        "\n\ndef main(x):\n    return _make_step()(x)\n",
    ],
    ids=["not called", "called twice", "called where made"],
)
def test_a_factory_not_called_once_as_step_equals_factory_is_declined(calls):
    """`return jax.pmap(...)` ending a factory is followed only through its one call,
    `step = factory(...)`; any other use keeps the faithful form, PL101 (an uncalled factory
    stopped the pass with an IndexError while its caller was looked up)."""
    source = (
        "import jax\n\n\ndef _make_step():\n    def step(x):\n"
        '        return jax.lax.psum(x, "i")\n\n    return jax.pmap(step, axis_name="i")\n'
    )
    (message,) = pmap_messages(source + calls)
    assert "[PL101] the step is returned by `_make_step`, followed only where" in message, message


STEP = """\
import functools
import jax
import jax.numpy as jnp


def step(w, x):
    return w - jax.lax.pmean(x.mean(0) * w, "i")

"""
CALLER = """

def main(w, x):
    n = jax.local_device_count()
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    w = p_step(w, x)
    return w[0]
"""
MADE = 'jax.pmap(step, axis_name="i")'
REBOUND_DEF = """\
@functools.partial(jax.pmap, axis_name="i")
    def p_step(w, x):
        return step(w, x)
    p_step = p_step"""
DECORATED = '@functools.partial(jax.pmap, axis_name="i")\n@functools.lru_cache\ndef p_step'


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        (
            f"if jax.device_count() > 1:\n    p_step = {MADE}\n",
            "[PL104] the step is made in `if jax.device_count() > 1:` at module level",
        ),
        (f"p_step = other = {MADE}\n", "[PL101] the pmapped step is not simply assigned"),
        (f"p_step = {MADE}; N = 1\n", "[PL101] the pmapped step is not simply assigned"),
        (f"p_step: object = {MADE}\n", "[PL101] the pmapped step is not simply assigned"),
        (f"STEPS = [{MADE}]\np_step = STEPS[0]\n", "[PL101] the pmapped step is not simply"),
        (f"p_step = {MADE}\np_step = {MADE}\n", "[PL107] `p_step` is bound more than once in"),
        (f'__all__ = ["p_step"]\np_step = {MADE}\n', "[PL201] `p_step` is named in a string"),
        (f"{DECORATED}(w, x):\n    return step(w, x)\n", "[PL106] the def has other decorators"),
    ],
    ids=[
        "if_block",
        "chained",
        "two_on_a_line",
        "annotated",
        "in_a_list",
        "bound_twice",
        "in_all",
        "two_decorators",
    ],
)
def test_a_module_level_step_made_other_than_plainly_is_declined_with_its_code(made, expected):
    """Each way a step made at module level is not followed has its code and says why: the
    program around it keeps its device axis (the faithful form, verified as any other)."""
    messages = pmap_messages(STEP + made + CALLER)
    assert messages and all(expected in m for m in messages), messages
    assert not any("(program-level)" in m for m in messages), messages


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        (f"p_step = other = {MADE}", "[PL101] the pmapped step is not simply assigned"),
        (
            'p_step = jax.pmap(step, axis_name="i", in_axes=(0,))',
            "[PL108] `in_axes` is not a tuple with one entry per argument",
        ),
        (
            'p_step = jax.pmap(step, axis_name="i", in_axes=(0, 1))',
            "[PL108] an `in_axes` entry other than 0 or None",
        ),
        (
            'p_step = jax.pmap(functools.partial(step, y=1), axis_name="i")',
            "[PL110] `partial` binds `y`, not a parameter of the def",
        ),
        (
            DECORATED.replace("\n", "\n    ") + "(w, x):\n        return step(w, x)",  # indented
            "[PL106] the def has other decorators",
        ),
        (
            REBOUND_DEF,
            "[PL107] `p_step` is bound more than once in `main`",
        ),
    ],
    ids=[
        "chained",
        "in_axes_short",
        "in_axes_one",
        "partial_unknown",
        "two_decorators",
        "decorated_rebound",
    ],
)
def test_a_step_made_in_its_function_other_than_taken_is_declined_with_its_code(made, expected):
    source = STEP + CALLER.replace("    w = jnp", f"    {made}\n    w = jnp", 1)
    messages = pmap_messages(source)
    assert messages and all(expected in m for m in messages), messages
    assert not any("(program-level)" in m for m in messages), messages


def test_a_module_step_fed_a_batch_in_one_function_and_a_copy_in_another_is_declined():
    """The functions calling a step made at module level must agree on which arguments are
    batches: the step has one `in_specs`."""
    evaluate = CALLER.replace("def main", "def evaluate").replace(
        "x = x.reshape((n, -1) + x.shape[1:])", "x = jnp.broadcast_to(x, (n,) + x.shape)"
    )
    source = STEP + f"p_step = {MADE}\n" + CALLER + "\n" + evaluate
    (message,) = pmap_messages(source)
    assert "[PL204] `p_step` gets a batch in one function and a replicated value in another" in (
        message
    ), message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "    if (m := x.mean(0)) is not None:\n        return m * w\n    return w",
            "[PL501] the body binds a name inside an expression",
        ),
        (
            "    while (m := x.mean()) > 100:\n        x = x / 2\n    return m * w",
            "[PL501] the body binds a name inside an expression",
        ),
        ("    parts = (w, x)\n    return (*parts,)", "[PL501] the body returns a starred tuple"),
    ],
    ids=["walrus_in_if", "walrus_in_while", "starred_return"],
)
def test_a_body_binding_or_returning_other_than_plainly_is_declined(body, expected):
    """A `:=` in an `if` or `while` test binds a per-device value (`m`) the statements did not
    see: read as a name from outside, `m * w` was taken as the same on every device, and the
    step took the program-level form with that result `P()`."""
    source = STEP.replace(
        '    return w - jax.lax.pmean(x.mean(0) * w, "i")', body
    ) + CALLER.replace("    w = jnp", f"    p_step = {MADE}\n    w = jnp", 1)
    (message,) = pmap_messages(source)
    assert expected in message and "(program-level)" not in message, message


PREDICT = """\
import jax
import jax.numpy as jnp


def predict(w, x):
    return jnp.tanh(x @ w)


def main(w, x):
    n = jax.local_device_count()
    p_predict = jax.pmap(predict, axis_name="i")
    w = jnp.broadcast_to(w, (n,) + w.shape)
    x = x.reshape((n, -1) + x.shape[1:])
    y = p_predict(w, x)
    return READ
"""


@pytest.mark.parametrize(
    "read",
    [
        "y.reshape(-1, y.shape[1])",  # a leading axis: the flat result has one fewer
        "y.reshape(y.shape[0] * y.shape[1], -1)",
        "y.reshape(y.size)",  # on several processes the flat result's size is the job's
        "y.reshape(-1, y.ndim)",
        'y.flatten(order="F")',  # another order of the elements
        "y.reshape(-1, *y.shape[-1:])",
    ],
)
def test_a_reshape_reading_what_the_device_axis_changes_is_declined(read):
    """A result that may differ between devices is read flat: `y.reshape(-1)`, `y.flatten()`,
    `y.reshape([-1, y.shape[-1]])` are kept as written, as the stacked and the flat result
    have the same elements in order. A shape reading the leading axes, the number of axes or
    the size of `y` would differ between the two, and the program-level form is not taken."""
    (message,) = pmap_messages(PREDICT.replace("READ", read))
    assert "[PL402] `y`, a result of `p_predict` that may differ between devices" in message
    assert "is read other than flattened" in message and "(program-level)" not in message


@pytest.mark.parametrize(
    "read",
    [
        "y.reshape(-1)",
        "y.flatten()",
        "y.ravel()",
        "y.reshape([-1, y.shape[-1]])",
        "y.reshape(2, -1)",
    ],
)
def test_a_reshape_the_same_of_the_stacked_and_the_flat_result_is_kept(read):
    source = PREDICT.replace("READ", read)
    messages = [s.message for s in migrate_source(source, options=Options(unsafe_fixes=True)).sites]
    assert any("(program-level)" in m for m in messages), messages
    assert any("the flat result has the same elements in order" in m for m in messages), messages
    code = migrate_source(source, options=Options(unsafe_fixes=True)).code
    method = read.split("(")[0].removeprefix("y")
    assert f'global_array_to_host_local_array(y, mesh, P("i")){method}(' in code, code


def test_a_helper_flattening_every_axis_is_kept_and_passed_this_processs_part():
    """flax's one-line `tohost` of `np.asarray(x).reshape(-1)` flattens each device's own axes
    too: it stays, given the flat result (deleting it, as the helper of `(n * b,) + rest`
    is, would leave those axes)."""
    helper = "def tohost(v):\n    return np.asarray(v).reshape(-1)\n\n\ndef main"
    source = PREDICT.replace("def main", helper).replace(
        "import jax\n", "import jax\nimport numpy as np\n", 1
    )
    result = migrate_source(source.replace("READ", "tohost(y)"), options=Options(unsafe_fixes=True))
    assert 'return tohost(multihost_utils.global_array_to_host_local_array(y, mesh, P("i")))' in (
        result.code
    ), result.code


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ("w = p_step(*(w, x))", "a call of `p_step` unpacks its arguments (`*` or `**`)"),
        ("w = p_step(w, x, x)", "a call of `p_step` passes more arguments than the body takes"),
        ("w = p_step(w)", "a call of `p_step` does not pass `x`"),
        ("w = p_step(w, y=x)", "a call of `p_step` passes a keyword the body does not take"),
        (
            "w = p_step(w, x)\n    w = p_step(w, x=x)",
            "the calls of `p_step` pass different arguments (by position or keyword)",
        ),
        (
            "w = p_step(x=x * 1, w=w + 0)",
            "keyword arguments computed in another order than the parameters they fill",
        ),
    ],
    ids=["star", "more", "missing", "keyword_unknown", "calls_differ", "keywords_reordered"],
)
def test_calls_the_step_cannot_take_as_they_are_are_declined(calls, expected):
    """The program-level step takes its arguments as its calls pass them, all calls alike: a
    call unpacking, passing too many or too few, a keyword the body does not have, calls that
    differ, or keywords computed out of order (passing them by position would reorder their
    side effects) keep the faithful form, PL204."""
    made = '    p_step = jax.pmap(step, axis_name="i")\n'
    source = STEP + CALLER.replace("    w = jnp", made + "    w = jnp", 1).replace(
        "w = p_step(w, x)", calls
    )
    (message,) = pmap_messages(source)
    assert f"[PL204] {expected}" in message and "(program-level)" not in message, message


DECORATED_STEP = (
    '@functools.partial(jax.pmap, axis_name="i")\ndef p_step(w, x):\n    return step(w, x)\n'
)


def test_a_decorated_step_calling_itself_is_declined():
    body = "    if False:\n        return p_step(w, x)\n    return step(w, x)"
    source = STEP + DECORATED_STEP.replace("    return step(w, x)", body) + CALLER
    (message,) = pmap_messages(source)
    assert "[PL205] `p_step` calls itself" in message and "(program-level)" not in message


def test_a_decorated_step_given_per_device_keys_is_declined():
    """Per-device keys take a lambda around the body (each device its own key, `key[0]`); a
    decorator has no place for it."""
    source = (
        STEP.replace("def step(w, x):", "def step(w, x, k):")
        + DECORATED_STEP.replace("(w, x)", "(w, x, k)")
        + CALLER.replace(
            "w = p_step(w, x)",
            "k = jax.random.split(jax.random.PRNGKey(0), n)\n    w = p_step(w, x, k)",
        )
    )
    (message,) = pmap_messages(source)
    assert "[PL305] `p_step` gets per-device keys and is made outside a function" in message


STORED = """\
import jax
import jax.numpy as jnp


class Evaluator:
    def __init__(self, predict_fn):
        def predict(params, batch):
            return jax.lax.psum(predict_fn(params, batch), axis_name="data")

        self.predict_fn = jax.pmap(predict, axis_name="data")

    def run(self, params, batches):
        n = jax.local_device_count()
        params = jnp.broadcast_to(params, (n,) + params.shape)
        outs = []
        for batch in batches:
            batch = batch.reshape((n, -1) + batch.shape[1:])
            out = self.predict_fn(params, batch)
            outs.append(out[0])
        return outs
"""
ENDS = "            outs.append(out[0])\n        return outs\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            ENDS,
            "            yield out[0]\n",
            (
                "[PL602] the step stored in `self.predict_fn` is called in `Evaluator.run`: `run` "
                "is a generator that yields where"
            ),
        ),
        (
            '        self.predict_fn = jax.pmap(predict, axis_name="data")\n',
            '        self.predict_fn = jax.pmap(predict, axis_name="data")\n'
            + "        self.first = self.predict_fn\n",
            "[PL201] `self.predict_fn` is read in `__init__`, where it is stored",
        ),
        (
            ENDS,
            ENDS + "\n    def peek(self, other):\n        return other.predict_fn\n",
            "[PL201] `.predict_fn` is read in `Evaluator.peek` on another object than `self`",
        ),
        (
            ENDS,
            ENDS + "\n\ndef peek(ev):\n    return ev.predict_fn\n",
            "[PL201] `ev.predict_fn` is read in `peek`, not in a method of `Evaluator`",
        ),
    ],
    ids=["generator", "read_where_stored", "other_object", "read_outside"],
)
def test_a_step_stored_on_self_not_taken_says_why(old, new, expected):
    """A step stored on `self` and called in one other method takes the program-level form
    there; when it cannot, the message says what blocks it (it said "its calls are not
    followed", PL101, for all of these)."""
    assert "(program-level)" in pmap_messages(STORED)[0]
    (message,) = pmap_messages(STORED.replace(old, new, 1))
    assert expected in message and "(program-level)" not in message, message


CALLEE = (FIXTURES.parent / "pmap" / "program_state_returned_by_callee.py").read_text()
RETURN = "    return params, float(np.mean(losses))\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            RETURN,
            "    if not batches:\n        return np.zeros(3), 0.0\n" + RETURN,
            (
                "[PL301] `p_train_step` is passed to `train_epoch`, where argument 1 of the step "
                "comes from elsewhere (`params`, unpacked from `train_epoch(p_train_step"
            ),
        ),
        (
            RETURN,
            "    if not batches:\n        return loss, 0.0\n" + RETURN,
            (
                "[PL401] `p_train_step` is passed to `train_epoch`, where `train_epoch` returns a "
                "result of the step as item 1 of what it returns, not the same one on every path"
            ),
        ),
        (
            "        params, loss = train_epoch(p_train_step, params, batches)\n",
            "        out = train_epoch(p_train_step, params, batches)\n        params, loss = out\n",
            (
                "[PL301] `p_train_step` is passed to `train_epoch`, where argument 1 of the step "
                "comes from elsewhere (`params`, unpacked from `out`)"
            ),
        ),
    ],
    ids=["another_value_on_one_path", "another_result_on_one_path", "bound_then_unpacked"],
)
def test_a_callee_returning_the_state_other_than_plainly_is_declined(old, new, expected):
    """A def the step is passed to returns the state it carries (flax's `train_epoch`): the
    caller takes it back as the step's result only when every path returns the same result
    and the caller unpacks it where it calls."""
    assert "(program-level)" in pmap_messages(CALLEE)[0]
    (message,) = pmap_messages(CALLEE.replace(old, new, 1))
    assert expected in message and "(program-level)" not in message, message


SEEN = (FIXTURES / "program_copies_seen_at_every_call.py").read_text()
HALVED = "    halved = _score_all(jax_utils.replicate(np.full(3, 0.5, np.float32)), xs[:1])\n"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # one call passes a value of its own: its layout is not a replication
        (HALVED, "    halved = _score_all(np.full((8, 3), 0.5, np.float32), xs[:1])\n"),
        # the def is used other than called: calls elsewhere may pass anything
        (HALVED, HALVED + "    score_all = _score_all\n"),
        # public: other modules may call it (the code base is not read here)
        ("_score_all", "score_all"),
        # decorated: its calls call the decorator's wrapper
        ("def _score_all(", "def _traced(f):\n    return f\n\n\n@_traced\ndef _score_all("),
    ],
    ids=["a_call_passes_another_value", "used_as_a_value", "public", "decorated"],
)
def test_copies_are_seen_only_where_every_call_passes_a_replication(old, new):
    """The fixture's `_score_all` takes the program-level form because each of its calls passes
    a replication; where one call may pass anything else, its parameter blocks (PL301), and the
    message names the `pmap-replicated` entry the project can write."""
    assert "(program-level)" in pmap_messages(SEEN)[0]
    (message,) = pmap_messages(SEEN.replace(old, new))
    assert "[PL301]" in message and "(`params_repl`, a parameter of" in message, message


TOP_LEVEL = SEEN.split("def main():")[0] + (
    "rng = np.random.default_rng(0)\n"
    "xs = [rng.normal(size=(8 * 2, 3)).astype(np.float32) for _ in range(2)]\n"
    "params_repl = jax_utils.replicate(np.linspace(-1.0, 1.0, 3, dtype=np.float32))\n"
    "print(_score_all(params_repl, xs))\n"
)


def test_copies_are_seen_at_calls_at_module_level_too():
    """A notebook's cells or a script's top level call the evaluation function: the module's
    statements are read in order, as a def's (what reaches each call)."""
    (message,) = pmap_messages(TOP_LEVEL)
    assert "(program-level)" in message, message
    again = TOP_LEVEL + "params_repl = np.ones((8, 3))\nprint(_score_all(params_repl, xs))\n"
    (message,) = pmap_messages(again)
    assert "[PL301]" in message and "(`params_repl`, a parameter of `_score_all`)" in message
    # the entry to write, and the call that keeps it from being seen
    assert (
        '`pmap-replicated = ["_score_all(params_repl)"]` (its call `_score_all(params_repl, xs)` '
        "passes `params_repl` = `np.ones((8, 3))`)"
    ) in message, message


def test_a_drawn_leaf_of_one_value_per_device_raises_in_global_batch() -> None:
    # A batch drawn per device may hold one value per device (`{"x": (n, b, d), "valid": (n,)}`,
    # the count of real rows of each device's padded block): pmap passed the body a scalar, the
    # program-level form would pass an array of one (`(1,)`), which the body computes otherwise
    # with (at --no-verify a crash far away, or other shapes). The helper raises there, naming
    # the leaf's shape; verification then writes the faithful form.
    source = """\
import jax
import jax.numpy as jnp
from flax import jax_utils


def step(w, batch):
    rows = jnp.arange(batch["x"].shape[0]) < batch["valid"]
    return jax.lax.psum(jnp.sum(jnp.where(rows, batch["x"] @ w, 0.0)), "batch")


def evaluate(w, batches):
    ws = jax_utils.replicate(w)
    p_step = jax.pmap(step, axis_name="batch")
    total = 0.0
    for batch in batches:
        total += float(p_step(ws, batch)[0])
    return total
"""
    result = migrate_source(source, options=Options(unsafe_fixes=True))
    assert "global_batch(batch, batch_sharding)" in result.code, result.code
    helper = result.code[result.code.index("def global_batch") :].split("\n\n\ndef ")[0]
    namespace: dict = {"np": np, "jax": jax}
    exec(helper, namespace)  # noqa: S102 (the helper jaxmigrate wrote)
    with pytest.raises(ValueError, match=r"one value per device, no rows: \(8,\)"):
        namespace["global_batch"]({"valid": np.ones(8)}, None)


def test_a_replicated_value_changed_in_place_through_another_name_keeps_the_faithful_form():
    # `host = w; ws = replicate(host); w *= 0`: the same NumPy array under two names; pmap's
    # replicas were copied before the change, the program-level form would pass it changed.
    source = PROGRAM.replace(
        "    w = jnp.broadcast_to(w, (n,) + w.shape)\n",
        "    host = w\n    ws = jnp.broadcast_to(host, (n,) + host.shape)\n    w *= 0.0\n",
    ).replace("w = p_step(w, x)", "w = p_step(ws, x)")
    messages = pmap_messages(source)
    assert any(
        "[PL303] `host`, replicated for the step, is changed in place" in m for m in messages
    ), messages


def test_a_keyword_named_like_a_value_changed_in_place_is_not_a_change_of_the_replicated_value():
    # `np.asarray(w, order="C")` holds `w`, not the list `order` the function appends to after
    # the replication: the keyword's name is no read, the program-level form is taken (it was
    # declined PL303, "changed in place after: `order.append(...)`").
    source = (
        PROGRAM.replace(
            "import jax.numpy as jnp\n",
            "import jax.numpy as jnp\nimport numpy as np\nfrom flax import jax_utils\n",
        )
        .replace(
            "    w = jnp.broadcast_to(w, (n,) + w.shape)\n",
            '    order = []\n    ws = jax_utils.replicate(np.asarray(w, order="C"))\n'
            '    order.append("replicated")\n',
        )
        .replace("w = p_step(w, x)", "w = p_step(ws, x)")
    )
    messages = pmap_messages(source)
    assert len(messages) == 1 and "(program-level)" in messages[0], messages
