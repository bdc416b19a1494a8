"""Sites only the program reaches: in a model class's method and in a `TestCase` method.

The `--verify-with` command is the unit: it runs on the original and on the rewritten tree, and
the calls of the callable created on each site's statement are recorded (inputs and outputs) and
compared. A wrong rewrite of the model's pmap is caught; without a command the sites stay
unverified, saying how to verify them.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = pytest.mark.jax

MODEL = textwrap.dedent("""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, PartitionSpec as P


    class Model:
        def __init__(self, scale):
            self.scale = scale
            self.step = jax.pmap(self._step, axis_name="i")  # SITE

        def _step(self, x):
            return x * self.scale + lax.psum(x, "i")
    """)
MODEL_REWRITE = MODEL.replace(
    'jax.pmap(self._step, axis_name="i")  # SITE',
    'jax.jit(jax.shard_map(BODY, mesh=Mesh(np.array(jax.devices()), ("i",)), '
    'in_specs=P("i"), out_specs=P("i")))',
)
RIGHT = "lambda x: self._step(x)"
WRONG = "lambda x: self._step(x) + 1"
TEST = textwrap.dedent("""
    import unittest

    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, PartitionSpec as P

    from pkg.model import Model


    class ModelTest(unittest.TestCase):
        def test_step(self):
            out = Model(2.0).step(np.arange(32, dtype=np.float32).reshape(8, 4))
            self.assertEqual(out.shape, (8, 4))

        def test_inline(self):
            f = jax.pmap(lambda x: x - lax.pmean(x, "i"), axis_name="i")  # SITE
            for i in range(2):
                f(np.ones((8, 3), np.float32) * np.arange(8, dtype=np.float32)[:, None] + i)

        def test_raises(self):  # the call's outcome is the exception the test expects
            g = jax.pmap(lambda x: x.reshape(3), axis_name="i")  # SITE
            with self.assertRaises(TypeError):
                g(np.ones((8, 4), np.float32))

        def test_skipped(self):
            self.skipTest("not on this JAX")
            h = jax.pmap(lambda x: x + 1, axis_name="i")  # SITE
            h(np.ones((8, 2), np.float32))

        @unittest.skipIf(True, "never here")
        def test_skipped_if(self):
            k = jax.pmap(lambda x: x + 1, axis_name="i")  # SITE
            k(np.ones((8, 2), np.float32))
    """)
TEST_REWRITE = TEST.replace(
    'jax.pmap(lambda x: x - lax.pmean(x, "i"), axis_name="i")  # SITE',
    'jax.jit(jax.shard_map(lambda x: x - lax.pmean(x, "i"), '
    'mesh=Mesh(np.array(jax.devices()), ("i",)), in_specs=P("i"), out_specs=P("i")))',
).replace(
    'jax.pmap(lambda x: x.reshape(3), axis_name="i")  # SITE',
    "jax.jit(jax.shard_map(lambda x: x.reshape(3), "
    'mesh=Mesh(np.array(jax.devices()), ("i",)), in_specs=P("i"), out_specs=P("i")))',
)


def site(text: str) -> tuple[Site, ...]:
    lines = [i for i, t in enumerate(text.splitlines(), 1) if "# SITE" in t]
    return tuple(
        Site("JM202", "pmap", line, 1, Safety.UNSAFE, "pmap", key=f"site{n}")
        for n, line in enumerate(lines)
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bound") / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text(MODEL)
    (root / "tests" / "test_model.py").write_text(TEST)
    return root


def run(project: Path, body: str, **config: object) -> dict[str, object]:
    requests = [
        VerifyRequest("pkg/model.py", MODEL, MODEL_REWRITE.replace("BODY", body), site(MODEL)),
        VerifyRequest("tests/test_model.py", TEST, TEST_REWRITE, site(TEST)),
    ]
    settings = {"timeout": 60.0, "jobs": 1} | config
    verdicts = verify(requests, VerifyConfig(root=project, **settings))  # type: ignore[arg-type]
    return {f"{path}:{key}": verdict for (path, key), verdict in verdicts.items()}


COMMAND = f"{sys.executable} -m pytest -q -x -p no:cacheprovider tests/test_model.py"


def test_sites_in_a_class_and_in_a_test_verify_through_the_command(project: Path) -> None:
    verdicts = run(project, RIGHT, verify_with=COMMAND)
    model, test = verdicts["pkg/model.py:site0"], verdicts["tests/test_model.py:site0"]
    assert model.status is Status.VERIFIED, (model.reason, model.details)
    assert "made the same 1 call(s) of it on both trees, with agreeing outputs" in model.reason
    assert test.status is Status.VERIFIED, (test.reason, test.details)
    assert test.details["calls"] == 2 and test.details["input_shapes"] == ["float32[8, 3]"]
    raises = verdicts["tests/test_model.py:site1"]
    assert raises.status is Status.VERIFIED, (raises.reason, raises.details)
    # a skipped test makes no call: its sites say which skip (dm-haiku's dot_test.py::test_pmap)
    skipped, skipped_if = (
        verdicts["tests/test_model.py:site2"],
        verdicts["tests/test_model.py:site3"],
    )
    assert skipped.status is Status.UNVERIFIED and skipped.reason.endswith(
        "made no call of it: `test_skipped` calls `self.skipTest(...)` before it (line 28)"
    ), skipped.reason
    assert skipped_if.status is Status.UNVERIFIED and skipped_if.reason.endswith(
        "made no call of it: `test_skipped_if` may be skipped (`@unittest.skipIf`, line 32)"
    ), skipped_if.reason


def test_a_wrong_rewrite_in_a_class_fails(project: Path) -> None:
    verdicts = run(project, WRONG, verify_with=COMMAND)
    model = verdicts["pkg/model.py:site0"]
    assert model.status is Status.FAILED, (model.reason, model.details)
    assert "outputs differ at output (float32[8, 4]) of call 1: values differ" in model.reason


def test_without_a_command_they_say_how_to_verify_them(project: Path) -> None:
    verdicts = run(project, RIGHT)
    for verdict in verdicts.values():
        assert verdict.status is Status.UNVERIFIED
        assert "cannot be run alone" in verdict.reason
        assert "pass --verify-with with tests that reach it" in verdict.reason


DRIVE = textwrap.dedent("""
    import sys
    from pathlib import Path

    import numpy as np

    from pkg.model import Model

    original = "jax.pmap" in Path("pkg/model.py").read_text()
    step = Model(2.0).step
    for _ in range(2 if original else 1):  # the rewritten tree stops after one call
        step(np.ones((8, 4), np.float32))
    if FAIL_BOTH or not original:
        sys.exit("the driver fails" if original else "the rewrite broke it")
    """)


@pytest.mark.parametrize("fail_both", [True, False], ids=["both-fail", "rewrite-fails"])
def test_a_command_failing_on_both_trees_is_no_reference(project: Path, fail_both: bool) -> None:
    """flax imagenet under `--processes 2`: the driver failed on the original tree too (each
    process its own `mkdtemp()` workdir), and the rewrite's fewer calls were called `failed`.
    A command that fails on both trees verifies nothing; one failing on the rewrite alone
    still fails the site."""
    (project / "drive.py").write_text(DRIVE.replace("FAIL_BOTH", str(fail_both)))
    verdict = run(project, RIGHT, verify_with=f"{sys.executable} drive.py")["pkg/model.py:site0"]
    assert "made 1 recorded call(s) of the site, the original 2" in verdict.reason, verdict.reason
    if fail_both:
        assert verdict.status is Status.UNVERIFIED, verdict.reason
        assert "failed on the original tree too" in verdict.reason
    else:
        assert verdict.status is Status.FAILED, verdict.reason
        assert "the rewrite broke it" in verdict.reason
