"""The messages between jaxmigrate and its verification workers: typed, versioned records.

A worker (`worker.py`) may run another interpreter and another JAX than jaxmigrate (the
original side under `--reference-jax 0.4.13`), so what crosses is plain data: one JSON object
per line, holding builtins only (numbers, strings, lists, dicts); arrays and Python values go
through pickle files named in the messages (`hostify`, `pickling`). Every message carries
`protocol` (this module's `VERSION`) and `kind`; `decode` checks both and every field's type,
and raises `ProtocolError` naming what does not match, so a worker package of another jaxmigrate
version is refused with that reason instead of being misread.

The parent builds the requests (`verify.messages`, `verify.bound`) and decodes the replies
(`verify.pool`); the worker decodes the requests and builds the replies. This module is shared
by both: it imports nothing but the standard library and runs on every Python the workers run
on (3.11 to 3.13).

Requests: `RunOriginal`, `RunCandidate` (a target on one side), `CompareRecords` (the calls two
runs of a command recorded), `Exit`; and `RecordPlan`, the file that tells the recorder in a
command's processes what to record. Files: `RecordedCall`, the sidecar of each call the recorder
wrote, and `CommandPaths`, the paths outside the tree a command names, kept. Replies: `Ready` (JAX is up), `Ran` (the original's outputs
are written), `Compared` (the rewrite against them), `RecordsCompared`, `Failed`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

VERSION = 1  # bump on any change of a message's fields or meaning


class ProtocolError(ValueError):
    """A message that is not one this version of the protocol sends; the text says why."""


# Parts of requests -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Module:
    """How a worker finds a module: dotted name, file and sys.path entry in its tree, and the
    text to execute instead of the file's (the rewrite's), if any."""

    module: str
    file: str
    path: str
    text: str | None = None


# The qualname of a target that is the module itself run as a program (`python file.py`): a
# program-level pmap group made and called outside any function (a script's statements, its
# `if __name__ == "__main__":` block).
SCRIPT = "<script>"


@dataclass(frozen=True, kw_only=True)
class Target(Module):
    """The function to run: its module, its qualified name (`SCRIPT`: the module run as a
    program), the name it is called by (a function the program only runs jitted), and the
    module with only its safe rewrites."""

    qualname: str
    call_as: str | None = None
    baseline: str | None = None


@dataclass(frozen=True, kw_only=True)
class Context:
    """A mesh-like `with` statement that enclosed a call: its items, evaluated in `module`;
    `bindings`, [name, expression] of the locals they read that their function assigns once
    before them (`mesh = jax.make_mesh(...)`), evaluated first, in order."""

    module: Module
    exprs: list[str]
    bindings: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """Where the original's inputs come from: recorded calls (pickle files), else declared,
    else synthesized for `structure` on `devices` devices."""

    recorded: list[str] = field(default_factory=list)
    synthesize: bool = False
    structure: dict[str, Any] = field(default_factory=dict)
    devices: int = 0
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Returned:
    """The calls of the function a factory target returned: recorded files (original side),
    and the contexts and meshes they ran under."""

    recorded: list[str] = field(default_factory=list)
    contexts: list[Context] = field(default_factory=list)
    meshes: list[dict[str, Any]] = field(default_factory=list)


# Requests --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Message:
    """What every message has: its kind (a class constant) and the protocol version."""

    KIND: ClassVar[str] = ""


@dataclass(frozen=True, kw_only=True)
class Run(Message):
    """Run a target on one side: under `contexts` (meshes built from `meshes`), its inputs and
    outputs in the pickle files `inputs_path` and `outputs_path`; `pristine` is the user's tree,
    to lay back a file a unit changed; `timeout` the seconds the parent waits."""

    target: Target
    contexts: list[Context] = field(default_factory=list)
    meshes: list[dict[str, Any]] = field(default_factory=list)
    inputs_path: str
    outputs_path: str
    pristine: str = ""
    returned: Returned = field(default_factory=Returned)
    layouts: list[dict[str, Any]] = field(default_factory=list)
    timeout: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RunOriginal(Run):
    """Run the original (else the first of `references` that runs) and write its inputs and
    outputs; `reach` are the sites' line spans its calls must run."""

    KIND: ClassVar[str] = "run-original"
    references: list[str]
    inputs: Inputs = field(default_factory=Inputs)
    reach: list[Any] = field(default_factory=list)  # [first, last] per site, or a unit's need


@dataclass(frozen=True, kw_only=True)
class RunCandidate(Run):
    """Run the rewrite on the original's inputs and compare with its outputs; `records` are the
    recorded calls whose import paths the pickles need."""

    KIND: ClassVar[str] = "run-candidate"
    records: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class CompareRecords(Message):
    """Compare the calls two runs of a command recorded: [inputs, outputs] pickles per call."""

    KIND: ClassVar[str] = "compare-records"
    original: list[list[str]]
    candidate: list[list[str]]
    timeout: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Exit(Message):
    """Stop serving."""

    KIND: ClassVar[str] = "exit"


Request = RunOriginal | RunCandidate | CompareRecords | Exit


@dataclass(frozen=True, kw_only=True)
class RecordPlan(Message):
    """What the recorder records in a command's run (`recorder`, from a file named by
    `JAXMIGRATE_RECORD`): in the tree `root`, into `out`, up to `max_calls` calls per target, of
    the callables made on `spans` (file -> [first, last, target id]) and of `functions` (module
    -> qualname -> target id); `outputs` are targets whose outputs are recorded too, `deep`
    scripts whose nested functions count (notebooks), `helpers` files whose calls are made for
    their caller's line, `reach` the line spans a function target's calls must run, `layouts`
    the program-level steps whose calls are recorded in the flat layout (`child.layouts`: the
    original's pmapped step, its stacked arguments and results brought to what the rewrite's
    `jax.jit` step takes and returns)."""

    KIND: ClassVar[str] = "record-plan"
    root: str
    out: str
    max_calls: int
    spans: dict[str, list[list[Any]]] = field(default_factory=dict)
    functions: dict[str, dict[str, str]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    deep: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)
    reach: dict[str, list[Any]] = field(default_factory=dict)
    layouts: dict[str, dict[str, Any]] = field(default_factory=dict)


# Files ---------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RecordedCall(Message):
    """The sidecar of one recorded call (`<base>.json` next to its `<base>.pkl`), written by the
    recorder in the command's process and read by jaxmigrate (`verify.recording.collect`) and
    the workers (`inputs`): its target id, the [file, line] of each mesh-like `with` around it
    and of each caller in the tree (`frames`: the rewrite's own `with` statements around the
    call are found from them), the meshes set and the arguments' shapes, its process in a job,
    the tree's folders the
    command imported from (`paths`) and the paths outside the tree it named, kept
    (`outside`: `child.outside.keep`'s entries)."""

    KIND: ClassVar[str] = "recorded-call"
    target: str
    contexts: list[list[Any]] = field(default_factory=list)
    frames: list[list[Any]] = field(default_factory=list)
    meshes: list[dict[str, Any]] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    process: int = 0
    paths: list[str] = field(default_factory=list)
    outside: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class CommandPaths(Message):
    """The paths outside the project a `--verify-with` command names, kept before its first
    run so that every later run starts from them as they were (`verify.recording.same_start`,
    `command-paths.json`): `child.outside.keep`'s entries."""

    KIND: ClassVar[str] = "command-paths"
    kept: list[dict[str, Any]] = field(default_factory=list)


# Replies ---------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Mismatch:
    """Where two outputs (or two runs' inputs) first differ (`child.compare`, `child.shown`):
    the leaf's `path` and `why`; an array's shape and dtype (and the rewrite's, if those
    differ), its errors; the call (0-based), whether in the function a factory returned, and
    whether in what a unit printed or wrote (`shown`)."""

    path: str
    why: str
    shape: list[int] | None = None
    dtype: str | None = None
    new_shape: list[int] | None = None
    new_dtype: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    call: int | None = None
    returned: bool | None = None
    shown: bool | None = None

    def details(self) -> dict[str, Any]:
        """Return the mismatch as a verdict's details hold it: the fields that are set."""
        return {k: v for k, v in plain_fields(self).items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class Shows:
    """What a unit's comparison covers: its return value, its printed lines, the files it
    wrote, the calls of its program-level step; `left_out` says what two runs of the original
    disagreed on (not compared)."""

    returned: bool
    printed: int
    files: list[str] = field(default_factory=list)
    left_out: str | None = None
    steps: int = 0  # the calls of a program-level step compared through the layout adapters

    def details(self) -> dict[str, Any]:
        return {k: v for k, v in plain_fields(self).items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class Lowered:
    """The sharding constraints and collectives a jitted function lowers with."""

    constraints: list[str] = field(default_factory=list)
    collectives: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Observed:
    """What the calls compiled (`child.observe`): how many compiles, the functions compiled
    again on the same code (name -> repeats), each function's lowering, and each output
    array's sharding (where -> text)."""

    compiles: int
    repeated: dict[str, int] = field(default_factory=dict)
    lowering: dict[str, Lowered] = field(default_factory=dict)
    shardings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Reply(Message):
    """A worker's answer (`OK`: a class constant, False for `Failed` only); `restart` says why
    the worker must start again before the next request. The verdicts read its attributes
    (`verify.judge`, `verify.bound`)."""

    OK: ClassVar[bool] = True
    restart: str | None = None


@dataclass(frozen=True, kw_only=True)
class Ready(Reply):
    """The worker started JAX (and joined its job): which JAX, how many devices."""

    KIND: ClassVar[str] = "ready"
    jax: str
    devices: int
    process: int = 0
    processes: int = 1


@dataclass(frozen=True, kw_only=True)
class Ran(Reply):
    """The original (or `reference`) ran and wrote its inputs and outputs."""

    KIND: ClassVar[str] = "ran"
    reference: str
    source: str
    calls: int
    returned_calls: int = 0
    input_shapes: list[Any] = field(default_factory=list)
    output_shapes: list[Any] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    observed: Observed | None = None
    shows: Shows | None = None  # a unit: what it returned, printed and wrote
    mapped_axis_size: int | None = None
    mesh_hint: str | None = None
    layout_violations: list[str] | None = None
    uncalled_steps: list[int] | None = None  # program-level steps' lines the run never called
    reference_errors: list[str] | None = None  # the references tried before, and why
    reference_stages: dict[str, str] | None = None
    missing_module: str | None = None  # the module whose absence kept the original from running
    determinism: str | None = None  # why a unit's original ran once only


@dataclass(frozen=True, kw_only=True)
class Compared(Reply):
    """The rewrite ran on the original's inputs: equal, or the first mismatch."""

    KIND: ClassVar[str] = "compared"
    equal: bool
    mismatch: Mismatch | None = None
    candidate_contexts: list[str] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    not_comparable: list[str] | None = None
    has_values: bool | None = None
    observed: Observed | None = None
    calls: int | None = None
    returned_calls: int | None = None


@dataclass(frozen=True, kw_only=True)
class RecordsCompared(Reply):
    """Two runs' recorded calls compared: diverged before the site, or equal, or a mismatch."""

    KIND: ClassVar[str] = "records-compared"
    equal: bool = False
    diverged: Mismatch | None = None
    mismatch: Mismatch | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    not_comparable: list[str] | None = None
    has_values: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Failed(Reply):
    """The request could not be done: at which `stage` (import, target, inputs, call, reach,
    worker, protocol), why, and what kind of failure it is."""

    KIND: ClassVar[str] = "failed"
    OK: ClassVar[bool] = False
    stage: str
    error: str
    errors: list[str] | None = None  # every reference's error, when none ran
    reference_errors: list[str] | None = None
    missing_module: str | None = None  # the module whose absence kept the original from running
    no_inputs: bool | None = None
    not_reached: bool | None = None
    uncomparable: bool | None = None
    not_kept: bool | None = None
    nondeterministic: bool | None = None


REQUESTS: dict[str, type[Message]] = {
    c.KIND: c for c in (RunOriginal, RunCandidate, CompareRecords, Exit)
}
REPLIES: dict[str, type[Message]] = {
    c.KIND: c for c in (Ready, Ran, Compared, RecordsCompared, Failed)
}


# Encoding and decoding ---------------------------------------------------------------------------
def plain_fields(record: Any) -> dict[str, Any]:
    """Return a record's fields as plain data (nested records as dicts)."""
    return {f.name: plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain_fields(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):  # a numpy scalar
        return value.item()
    return value


T = typing.TypeVar("T")


def record(cls: type[T], data: Any) -> T:
    """Return a `cls` record (a part of a message) from plain data, checked as `decode` checks
    it: the worker builds the parts it computes as dicts (`Mismatch`, `Shows`, `Observed`)."""
    return typing.cast(T, build(cls, plain(data), cls.__name__))


def encode(message: Message) -> str:
    """Return `message` as one line of JSON, with its protocol version and kind."""
    data = {"protocol": VERSION, "kind": message.KIND, **plain_fields(message)}
    return json.dumps(data, default=json_default) + "\n"


def json_default(value: Any) -> Any:
    """Return what JSON writes for a value it does not know: a numpy scalar's number."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return str(value)


def decode_request(line: str | bytes) -> Request:
    """Return the request a line holds; raise ProtocolError saying what does not match."""
    return typing.cast(Request, decode(line, REQUESTS, "request"))


def decode_plan(text: str | bytes) -> RecordPlan:
    """Return the recording plan a file holds; raise ProtocolError saying what does not match."""
    return typing.cast(RecordPlan, decode(text, {RecordPlan.KIND: RecordPlan}, "recording plan"))


def decode_recorded_call(text: str | bytes) -> RecordedCall:
    """Return the recorded call a sidecar holds; raise ProtocolError saying what does not match."""
    kinds: dict[str, type[Message]] = {RecordedCall.KIND: RecordedCall}
    return typing.cast(RecordedCall, decode(text, kinds, "recorded call's sidecar"))


def decode_command_paths(text: str | bytes) -> CommandPaths:
    """Return the kept paths a `command-paths.json` holds; raise ProtocolError if it does not
    match this protocol."""
    kinds: dict[str, type[Message]] = {CommandPaths.KIND: CommandPaths}
    return typing.cast(CommandPaths, decode(text, kinds, "command's kept paths"))


def decode_reply(line: str | bytes) -> Reply:
    """Return the reply a line holds; raise ProtocolError saying what does not match."""
    return typing.cast(Reply, decode(line, REPLIES, "reply"))


def decode(line: str | bytes, kinds: dict[str, type[Message]], what: str) -> Message:
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        text = line if isinstance(line, str) else line.decode(errors="replace")
        raise ProtocolError(f"a {what} that is not JSON: {text[:100]!r}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a {what} that is not a JSON object: {type(data).__name__}")
    version = data.get("protocol")
    if version is None:
        keys = ", ".join(sorted(data)[:6])
        raise ProtocolError(
            f"a {what} without a protocol version (keys: {keys}): it comes from a jaxmigrate "
            f"worker package older than protocol {VERSION}, which this jaxmigrate speaks"
        )
    if version != VERSION:
        raise ProtocolError(
            f"a {what} in protocol {version!r}, but this jaxmigrate speaks protocol {VERSION}: "
            "the two ends come from different jaxmigrate versions"
        )
    kind = data.get("kind")
    if kind not in kinds:
        known = ", ".join(kinds)
        raise ProtocolError(f"a {what} of unknown kind {kind!r} (protocol {VERSION}: {known})")
    fields = {k: v for k, v in data.items() if k not in ("protocol", "kind")}
    return typing.cast(Message, build(kinds[kind], fields, kind))


def build(cls: type, data: Any, where: str) -> Any:
    """Return a `cls` record from `data`, every field checked against its annotation."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{where} should be an object, got {type(data).__name__}")
    hints, names = layout(cls)
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ProtocolError(f"{where} has fields protocol {VERSION} does not know: {unknown}")
    values = {}
    for name, spec in names.items():
        if name not in data:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{where} lacks its field `{name}`")
            continue
        values[name] = check(data[name], hints[name], f"{where}.{name}")
    return cls(**values)


@functools.cache
def layout(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """Return a record class's field types and fields (read once per class)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def check(value: Any, hint: Any, where: str) -> Any:
    """Return `value` as the type `hint` names (records built); raise ProtocolError if not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, _UnionType):
        if value is None and type(None) in args:
            return None
        kept = [a for a in args if a is not type(None)]
        return check(value, kept[0], where) if len(kept) == 1 else value
    if dataclasses.is_dataclass(hint):
        return build(typing.cast(type, hint), value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} should be a list, got {type(value).__name__}")
        return [check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} should be an object, got {type(value).__name__}")
        return {k: check(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
    wanted: tuple[type, ...] = (int, float) if hint is float else (hint,)
    if not isinstance(value, wanted) or (hint in (int, float) and isinstance(value, bool)):
        raise ProtocolError(f"{where} should be {hint.__name__}, got {type(value).__name__}")
    return value


_UnionType = type(int | None)
