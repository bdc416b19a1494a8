"""A function given an iterator (a generator of batches) is verified on what it drew.

The recorder cannot pickle a generator; it wraps it, passes its items through, and records the
items the call drew (`recorder.Drawing`, replayed as `HostDrawn`: a fresh iterator over them at
each run). The program is the `program_drawn_batches` fixture: `train(params, batches)` loops
over a generator, and the pmap rule converts each batch where it is passed (`global_batch`).
Real JAX on 8 simulated CPU devices, real subprocesses.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clitools import jm

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify
from jaxmigrate.verify.child.hostify import from_host
from jaxmigrate.verify.child.pickling import dumps
from jaxmigrate.verify.child.recorder import MAX_DRAWN, drawn_from
from jaxmigrate.verify.child.values import HostDrawn

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "pmap" / "program_drawn_batches.py"
COMMAND = f"{sys.executable} -c 'import drawn; drawn.main()'"


def project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "drawn.py").write_text(text)
    for args in (["init", "-q"], ["add", "drawn.py"], ["commit", "-qm", "drawn"]):
        subprocess.run(
            ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )
    return tmp_path


def test_an_iterator_argument_is_recorded_as_the_items_drawn_and_replayed_afresh() -> None:
    def gen():
        yield {"x": np.arange(3.0)}
        yield {"x": np.arange(3.0) + 1}
        yield {"x": np.arange(3.0) + 2}

    with open(__file__) as handle:
        args, kwargs, drawing = drawn_from((1.0, gen()), {"files": handle})
    assert len(drawing) == 1 and args[1] is drawing[0]  # the file is an iterator, not drawn
    assert kwargs["files"] is handle
    seen = [next(args[1])["x"][0] for _ in range(2)]  # the call draws two of three
    payload = dumps((args, {}))
    (_, travelling), _ = pickle.loads(payload)
    assert isinstance(travelling, HostDrawn) and len(travelling.items) == 2
    for _ in range(2):  # every run replays both items, from the start
        (_, replayed), _ = from_host(pickle.loads(payload))
        assert [float(b["x"][0]) for b in replayed] == seen == [0.0, 1.0]


def test_a_stream_longer_than_a_record_keeps_is_not_recorded() -> None:
    _, _, (drawing,) = drawn_from((iter(range(MAX_DRAWN + 1)),), {})
    assert sum(1 for _ in drawing) == MAX_DRAWN + 1 and not drawing.kept


def test_a_training_loop_over_a_generator_is_verified_and_written(tmp_path: Path) -> None:
    root = project(tmp_path, FIXTURE.read_text())
    report = tmp_path.parent / f"{tmp_path.name}.json"
    proc = jm(
        *("run", "drawn.py", "--select", "pmap", "--verify-with", COMMAND, "--timeout", "300"),
        *("--report", str(report), "--format", "json"),
        cwd=root,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(report.read_text())["files"]
    assert len(entry["sites"]) == 5
    for site in entry["sites"]:
        assert site["status"] == "verified" and site["applied"], site
    written = (root / "drawn.py").read_text()
    assert "global_batch(batch, batch_sharding)" in written and "jax.pmap(" not in written


def test_a_wrong_conversion_of_drawn_batches_fails(tmp_path: Path) -> None:
    """The same program with the conversion taking the rows in the wrong order: every device
    still gets a block of the right shape, only the items drawn show the difference."""
    text = FIXTURE.read_text()
    root = project(tmp_path, text)
    migrated = migrate_source(text, options=Options(unsafe_fixes=True))
    right = "x.reshape(-1, *x.shape[2:])"
    assert right in migrated.code
    wrong = migrated.code.replace(right, "x.swapaxes(0, 1).reshape(-1, *x.shape[2:])")
    request = VerifyRequest("drawn.py", text, wrong, tuple(migrated.sites))
    config = VerifyConfig(root=root, timeout=300.0, jobs=1, verify_with=COMMAND)
    verdicts = verify([request], config)
    assert verdicts and all(v.status.value == "failed" for v in verdicts.values()), verdicts
    for verdict in verdicts.values():  # the step's calls, compared in the flat layout, show it
        assert "['step calls (flat layout)'][0]['arguments'][1]" in str(verdict.reason), verdict
