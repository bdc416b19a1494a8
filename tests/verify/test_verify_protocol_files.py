"""The files that cross interpreters are protocol records too (`child.protocol`).

A recorded call's sidecar is written by the recorder in the user's command (the original side's
interpreter, maybe JAX 0.4.13) and read by jaxmigrate and the workers; `command-paths.json`
keeps the paths outside the project a `--verify-with` command names. Each carries the protocol
version and kind: one of another jaxmigrate is refused with the reason, never misread.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxmigrate.verify.child.protocol import (
    VERSION,
    CommandPaths,
    ProtocolError,
    RecordedCall,
    decode_command_paths,
    decode_recorded_call,
    encode,
)
from jaxmigrate.verify.config import VerifyConfig
from jaxmigrate.verify.recording import collect, same_start
from jaxmigrate.verify.workspace import Workspace

pytestmark = pytest.mark.one_jax  # not again on JAX 0.12 (.ci/run)

CALL = RecordedCall(
    target="m.py:step",
    contexts=[["m.py", 12]],
    meshes=[{"axis_names": ["i"], "shape": [8]}],
    shapes=["float32[8, 3]"],
    paths=["tests"],
    outside=[{"key": "arg 0", "path": "/tmp/x", "present": False}],
)
# what a recorder of jaxmigrate before the protocol wrote: a plain dict
UNVERSIONED = {
    "target": "m.py:step",
    "contexts": [],
    "meshes": [],
    "shapes": [],
    "process": 0,
    "paths": [],
    "outside": [],
}


def write_call(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(text, encoding="utf-8")
    (folder / f"{name}.pkl").write_bytes(b"")


def test_a_recorded_calls_sidecar_round_trips_and_is_collected(tmp_path: Path) -> None:
    assert decode_recorded_call(encode(CALL)) == CALL
    ws = Workspace(tmp_path / "ws")
    write_call(ws.records, "m.py:step-1-0", encode(CALL))
    refused: list[str] = []
    found = collect(ws, max_calls=3, refused=refused)
    assert refused == []
    assert found["m.py:step"].contexts == (("m.py", 12),)
    assert found["m.py:step"].shapes == ("float32[8, 3]",)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            json.dumps(UNVERSIONED),
            (
                "a recorded call's sidecar without a protocol version (keys: contexts, meshes, "
                "outside, paths, process, shapes): it comes from a jaxmigrate worker package "
                f"older than protocol {VERSION}"
            ),
        ),
        (
            json.dumps({"protocol": VERSION + 1, "kind": "recorded-call", "target": "t"}),
            (
                f"a recorded call's sidecar in protocol {VERSION + 1}, but this jaxmigrate "
                f"speaks protocol {VERSION}"
            ),
        ),
        (
            json.dumps({"protocol": VERSION, "kind": "recorded-call", "contexts": []}),
            "recorded-call lacks its field `target`",
        ),
        (
            json.dumps({"protocol": VERSION, "kind": "recorded-call", "target": 3}),
            "recorded-call.target",
        ),
    ],
)
def test_a_sidecar_of_another_protocol_is_refused_with_the_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_recorded_call(text)
    assert reason in str(caught.value)
    ws = Workspace(tmp_path / "ws")
    write_call(ws.records, "m.py:step-1-0", text)
    write_call(ws.records, "m.py:other-1-0", encode(CALL))
    refused: list[str] = []
    found = collect(ws, max_calls=3, refused=refused)
    assert list(found) == ["m.py:step"]  # the readable one (its target is m.py:step)
    assert len(refused) == 1 and refused[0].startswith("m.py:step-1-0.json: ")
    assert reason in refused[0]


@pytest.mark.jax
def test_a_worker_refuses_a_sidecar_of_another_protocol_naming_the_file(tmp_path: Path) -> None:
    from jaxmigrate.verify.child.inputs import add_import_paths, sidecar

    write_call(tmp_path, "call", encode(CALL))
    assert sidecar(str(tmp_path / "call.pkl")) == CALL
    assert sidecar(str(tmp_path / "none.pkl")) is None  # no sidecar: nothing to add
    write_call(tmp_path, "old", json.dumps(UNVERSIONED))
    with pytest.raises(ProtocolError) as caught:
        add_import_paths(str(tmp_path / "old.pkl"))
    assert str(caught.value).startswith(
        "old.json: a recorded call's sidecar without a protocol version"
    )


def test_command_paths_are_a_versioned_record(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "state.txt").write_text("before", encoding="utf-8")
    project = tmp_path / "project"
    project.mkdir()
    ws = Workspace(tmp_path / "ws")
    ws.base.mkdir()
    config = VerifyConfig(root=project)
    command = f"python train.py {outside}"
    same_start(command, ws, config, first=True)
    saved = decode_command_paths((ws.base / "command-paths.json").read_text(encoding="utf-8"))
    assert isinstance(saved, CommandPaths)
    assert [entry["path"] for entry in saved.kept] == [str(outside)]
    (outside / "state.txt").write_text("after the first run", encoding="utf-8")
    same_start(command, ws, config, first=False)  # laid back as it was
    assert (outside / "state.txt").read_text(encoding="utf-8") == "before"
    # the file of a jaxmigrate before the protocol (a plain list) is refused, saying why
    (ws.base / "command-paths.json").write_text(json.dumps(saved.kept), encoding="utf-8")
    with pytest.raises(ProtocolError) as caught:
        same_start(command, ws, config, first=False)
    assert str(caught.value) == "a command's kept paths that is not a JSON object: list"
    newer = {"protocol": VERSION + 1, "kind": "command-paths", "kept": []}
    (ws.base / "command-paths.json").write_text(json.dumps(newer), encoding="utf-8")
    with pytest.raises(ProtocolError, match=f"in protocol {VERSION + 1}, but this jaxmigrate"):
        same_start(command, ws, config, first=False)
