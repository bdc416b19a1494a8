"""The messages between jaxmigrate and its workers are typed, versioned records (`child.protocol`).

They cross interpreters and JAX versions (the original side may run JAX 0.4.13 in another venv),
so each carries its protocol version and kind, and decoding checks every field: a worker package
of another jaxmigrate version is refused with what does not match, never misread.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest

from jaxmigrate.model import Safety, Site, Status
from jaxmigrate.verify.child import protocol
from jaxmigrate.verify.child.protocol import (
    VERSION,
    Compared,
    CompareRecords,
    Context,
    Exit,
    Failed,
    Mismatch,
    Module,
    ProtocolError,
    Ran,
    Ready,
    RecordPlan,
    RecordsCompared,
    Shows,
    Target,
    decode_reply,
    decode_request,
    encode,
)
from jaxmigrate.verify.config import VerifyConfig, VerifyRequest
from jaxmigrate.verify.judge import candidate_verdict
from jaxmigrate.verify.messages import Sources, make_task
from jaxmigrate.verify.planner import plan_all
from jaxmigrate.verify.pool import Reply, Worker
from jaxmigrate.verify.workspace import CHILD_PACKAGE, Workspace, workspace

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

REPO = Path(__file__).resolve().parents[2]
BEFORE_PROTOCOL = "c3fc652e627351d83eb516356b3dd56b37335837"  # main before the protocol: its worker sends unversioned dicts
LEGACY = """
import jax
import jax.numpy as jnp


def main():
    step = jax.pmap(lambda x: x * 2, axis_name="i")
    return step(jnp.ones((jax.local_device_count(), 3)))
"""


# Round trips (no JAX) ---------------------------------------------------------------------------
def real_task(tmp_path: Path) -> tuple[object, object]:
    """Return the two requests jaxmigrate builds for a pmap site of a `main()`."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "m.py").write_text(LEGACY)
    site = Site("JM202", "pmap", 7, 12, Safety.UNSAFE, "pmap", key="pmap:7")
    candidate = LEGACY.replace("x * 2", "x + x")
    request = VerifyRequest("m.py", LEGACY, candidate, (site,), baseline=LEGACY)
    (plan,), _ = plan_all([request], root)
    sources = Sources(root, {"m.py": LEGACY}, {"m.py": candidate})
    task = make_task(plan, candidate, None, sources, Workspace(tmp_path / "ws"), True, 8)
    return task.original, task.candidate


def test_every_request_jaxmigrate_sends_decodes_to_the_same_record(tmp_path: Path) -> None:
    original, candidate = real_task(tmp_path)
    compare = CompareRecords(original=[["a.pkl", "a.out.pkl"]], candidate=[["b.pkl", "b.out.pkl"]])
    for message in (original, candidate, compare, Exit()):
        line = encode(message)  # type: ignore[arg-type]
        assert line.endswith("\n") and "\n" not in line[:-1]  # one line of JSON
        data = json.loads(line)
        assert (data["protocol"], data["kind"]) == (VERSION, message.KIND)  # type: ignore[attr-defined]
        assert decode_request(line) == message
    assert original.target.baseline == LEGACY and original.references[0] == "original"  # type: ignore[attr-defined]
    assert candidate.target.text.count("x + x") == 1  # type: ignore[attr-defined]


def test_every_reply_decodes_to_the_same_record_with_numpy_numbers_as_plain_ones() -> None:
    replies = [
        Ready(jax="0.4.30", devices=8),
        Ran(
            reference="original",
            source="run",
            calls=1,
            contexts=["mesh"],
            shows=Shows(returned=False, printed=2),
        ),
        Compared(equal=True, max_abs_err=0.0, max_rel_err=1e-7, not_comparable=[]),
        Compared(equal=False, mismatch=Mismatch(path="[0]", why="values differ", call=0)),
        RecordsCompared(diverged=Mismatch(path="[1]", why="shapes differ", call=2)),
        Failed(stage="inputs", error="no inputs were recorded or declared", no_inputs=True),
    ]
    for reply in replies:
        assert decode_reply(encode(reply)) == reply
    numpy = Compared(equal=True, max_abs_err=np.float32(0.5), max_rel_err=np.float64(0.25))
    back = decode_reply(encode(numpy))
    assert isinstance(back, Compared) and back.max_abs_err == 0.5 and back.max_rel_err == 0.25
    assert not replies[-1].OK and all(r.OK for r in replies[:-1])


def test_the_recording_plan_round_trips_and_an_unversioned_one_is_refused(tmp_path: Path) -> None:
    from jaxmigrate.verify.child.recorder import load_plan

    plan = RecordPlan(
        root=str(tmp_path),
        out=str(tmp_path / "records"),
        max_calls=3,
        spans={"m.py": [[7, 7, "m.py::main~site0"]]},
        functions={"m": {"main": "m.py::main"}},
        reach={"m.py::main": [[7, 7]]},
    )
    path = tmp_path / "plan.json"
    path.write_text(encode(plan))
    recorder = load_plan(str(path))
    assert recorder.functions == {"m": {"main": "m.py::main"}}
    assert recorder.reach == {"m.py::main": [[7, 7]]}
    data = json.loads(encode(plan))
    del data["protocol"], data["kind"]  # as jaxmigrate wrote it before the protocol
    path.write_text(json.dumps(data))
    with pytest.raises(ProtocolError, match="a recording plan without a protocol version"):
        load_plan(str(path))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("protocol"), "a request without a protocol version (keys: "),
        (lambda d: d.update(protocol=VERSION + 1), f"in protocol {VERSION + 1}, but this"),
        (lambda d: d.update(kind="run"), "a request of unknown kind 'run' (protocol"),
        (lambda d: d["target"].pop("qualname"), "run-candidate.target lacks its field `qualname`"),
        (lambda d: d.update(timeout="120"), "run-candidate.timeout should be float, got str"),
        (lambda d: d["contexts"][0].update(exprs="mesh"), "contexts[0].exprs should be a list"),
        (lambda d: d.update(op="run"), "run-candidate has fields protocol 1 does not know: ['op']"),
    ],
)
def test_a_request_that_does_not_match_the_protocol_is_refused_saying_why(
    change: object, message: str
) -> None:
    module = Module(module="m", file="m.py", path=".")
    request = protocol.RunCandidate(
        target=Target(module="m", file="m.py", path=".", qualname="main"),
        contexts=[Context(module=module, exprs=["mesh"])],
        inputs_path="in.pkl",
        outputs_path="out.pkl",
    )
    data = json.loads(encode(request))
    change(data)  # type: ignore[operator]
    with pytest.raises(ProtocolError) as caught:
        decode_request(json.dumps(data))
    assert message in str(caught.value)


def test_a_request_the_rewrites_worker_refused_is_no_failure_of_the_rewrite(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    site = Site("JM202", "pmap", 7, 12, Safety.UNSAFE, "pmap", key="pmap:7")
    (plan,), _ = plan_all([VerifyRequest("m.py", LEGACY, LEGACY, (site,))], root)
    original = Ran(reference="original", source="run", calls=1)
    refused = Failed(stage="protocol", error="this worker refused: a request in protocol 2")
    verdict = candidate_verdict(plan, original, Reply(refused))
    assert verdict.status is Status.UNVERIFIED
    assert verdict.reason == (
        "the verifier could not run the rewrite: this worker refused: a request in protocol 2"
    )


# Real workers of another version ---------------------------------------------------------------
def first_reply(tmp_path: Path, install: object, message: object = None) -> tuple[Worker, object]:
    """Start a real worker whose package `install(package_folder)` changed; return its reply to
    `message` (or to a records comparison), as the verification sees it."""
    root = tmp_path / "project"
    root.mkdir(exist_ok=True)
    config = VerifyConfig(root=root, jobs=1)
    with workspace(root, {}, {}) as ws:
        install(ws.child / CHILD_PACKAGE)  # type: ignore[operator]
        worker = Worker("candidate", config, ws, 0)
        try:
            if message is None:
                return worker, worker.request(CompareRecords(original=[], candidate=[]), 120)
            fault = worker.ensure_ready()
            assert fault is None, fault.fault
            worker.processes[0].send(message)  # type: ignore[arg-type]
            return worker, worker.receive(120)
        finally:
            worker.stop()


@pytest.mark.jax
def test_a_worker_of_a_newer_protocol_is_refused_naming_both_versions(tmp_path: Path) -> None:
    def newer(package: Path) -> None:
        code = package / "protocol.py"
        text = code.read_text()
        code.write_text(text.replace(f"VERSION = {VERSION}", f"VERSION = {VERSION + 1}", 1))

    _, reply = first_reply(tmp_path, newer)
    assert reply.kind == "start", reply  # type: ignore[attr-defined]
    assert reply.fault == (  # type: ignore[attr-defined]
        "could not start a worker: it sent a message this jaxmigrate cannot read: a reply in "
        f"protocol {VERSION + 1}, but this jaxmigrate speaks protocol {VERSION}: the two ends "
        "come from different jaxmigrate versions"
    )


def package_before_the_protocol(dest: Path) -> None:
    """Write the worker package of jaxmigrate before the protocol (from git) into `dest`."""
    prefix = "src/jaxmigrate/verify/child/"
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BEFORE_PROTOCOL, prefix],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.skip(f"no git history with {BEFORE_PROTOCOL}: {archive.stderr.decode()[-200:]}")
    shutil.rmtree(dest)
    dest.mkdir()
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                source = tar.extractfile(member)
                assert source is not None
                (dest / member.name.removeprefix(prefix)).write_bytes(source.read())
    assert not (dest / "protocol.py").exists()


@pytest.mark.jax
def test_a_worker_from_before_the_protocol_is_refused_saying_so(tmp_path: Path) -> None:
    _, reply = first_reply(tmp_path, package_before_the_protocol)
    assert reply.kind == "start", reply  # type: ignore[attr-defined]
    fault = reply.fault  # type: ignore[attr-defined]
    assert fault.startswith(
        "could not start a worker: it sent a message this jaxmigrate cannot read: a reply "
        "without a protocol version (keys: devices, jax, process, processes, ready): it comes "
        f"from a jaxmigrate worker package older than protocol {VERSION}"
    ), fault


@pytest.mark.jax
def test_a_worker_refuses_a_request_from_before_the_protocol(tmp_path: Path) -> None:
    old = json.dumps({"op": "compare_records", "original": [], "candidate": []}) + "\n"
    _, reply = first_reply(tmp_path, lambda package: None, old.encode())
    data = reply.message  # type: ignore[attr-defined]
    assert isinstance(data, Failed) and data.stage == "protocol", data
    assert data.error.startswith(
        "this worker refused: a request without a protocol version (keys: candidate, op, original)"
    )


def test_the_parts_of_a_reply_are_records_checked_on_decode() -> None:
    """A mismatch, what a unit shows and what JAX compiled are typed too: the verdicts read
    their attributes, and a part that does not fit is refused with where it is."""
    seen = {"compiles": 2, "repeated": {"f": 1}, "lowering": {"f": {"constraints": ["P('i')"]}}}
    compared = Compared(equal=True, observed=protocol.record(protocol.Observed, seen))
    back = decode_reply(encode(compared))
    assert isinstance(back, Compared) and back.observed is not None
    assert back.observed.lowering["f"].constraints == ["P('i')"]
    assert back.observed.lowering["f"].collectives == []
    line = json.loads(encode(Compared(equal=False, mismatch=Mismatch(path="[0]", why="x"))))
    line["mismatch"]["call"] = "first"
    with pytest.raises(ProtocolError, match=r"compared\.mismatch\.call should be int, got str"):
        decode_reply(json.dumps(line))
    line["mismatch"] = {"path": "[0]", "why": "x", "leaf": 3}
    with pytest.raises(ProtocolError, match=r"does not know: \['leaf'\]"):
        decode_reply(json.dumps(line))
    # what a verdict's details hold: the fields that are set, as before
    found = Mismatch(path="[0]", why="values differ", shape=[2], dtype="float32", call=1)
    assert found.details() == {
        "path": "[0]",
        "why": "values differ",
        "shape": [2],
        "dtype": "float32",
        "call": 1,
    }
