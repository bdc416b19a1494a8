"""What the caller asks of the verifier, and what it answers per site."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxmigrate.model import Site, Status
from jaxmigrate.verify.processes import devices_per_process

if TYPE_CHECKING:
    from jaxmigrate.toolkit.passes import Pass

GIB = 2**30


def default_jobs() -> int:
    """Return the default number of worker pairs: one per two cores."""
    return max(1, (os.cpu_count() or 2) // 2)


@dataclass(frozen=True)
class VerifyConfig:
    """How to verify: the project, the interpreter, the mesh, the inputs and the limits.

    `root` is copied (never written); `python` runs the user's code; `verify_with` is a shell
    command whose calls are recorded on the original copy; `timeout` bounds each site (seconds)
    and `memory_limit` each worker's address space (bytes, 0 for none); `jobs` is the number of
    worker pairs (one original, one candidate process each); `synthesize` allows inputs built
    from the call's structure; `passes` (default: the registry) re-derives a file's rewrite with
    only some sites enabled when a request gives no `rewrite`. With `processes` N > 1 the
    recorded command and every worker run as N-process JAX jobs on this machine (`devices` split
    evenly between them, else DeviceSplitError), and a site holds only if it holds in every process.
    With `project_tests` (the default), a function target `verify_with` never called is recorded
    by the project's own tests that name it (`verify.discover`); False records `verify_with` only.
    """

    root: Path
    devices: int = 8
    python: str = sys.executable
    verify_with: str | None = None
    timeout: float = 120.0
    memory_limit: int = 8 * GIB
    jobs: int = field(default_factory=default_jobs)
    synthesize: bool = True
    max_calls: int = 3
    record_timeout: float = 1800.0
    passes: tuple[type[Pass], ...] | None = None
    workdir: Path | None = None
    processes: int = 1
    project_tests: bool = True
    notebook_timeout: float | None = None  # bounds each run of a notebook (None: record_timeout)
    # The interpreter of the original side (its workers and the recorded command), with the JAX
    # the code was written for (`verify.reference`); None: `python`, as the rewritten side.
    reference_python: str | None = None

    def __post_init__(self) -> None:
        devices_per_process(self.devices, self.processes)  # raises DeviceSplitError

    def python_of(self, side: str) -> str:
        """Return the interpreter that runs `side` ("original" or "candidate")."""
        if side == "original" and self.reference_python:
            return self.reference_python
        return self.python

    def command_dir(self, copy_root: Path) -> Path:
        """Return where `verify_with` runs in a copy: the user's working directory, mirrored."""
        if self.workdir is None:
            return copy_root
        try:
            return copy_root / self.workdir.resolve().relative_to(self.root.resolve())
        except ValueError:
            return copy_root


@dataclass(frozen=True)
class VerifyRequest:
    """One file: its original text, its text with every site rewritten, and its sites.

    `rewrite(keys)`, when given, returns the file with only the sites in `keys` rewritten; the
    verifier uses it to drop failed sites and re-verify the rest as they will be written.
    `baseline`, when given, is the original with only its safe sites rewritten: the reference
    when the original itself no longer runs (say, it imports a module JAX removed).
    `alternatives[key]` is `candidate` with site `key` in another form (the idiomatic pmap
    rewrite, body unchanged); when the emitted form verifies, the alternative is verified too
    and the verdict's details say how it went (`alternative`: site, status, reason).
    `command`, when given, is the program that runs this file (a notebook's code cells as a
    script): every site is bound to it (`verify.notebooks`); `label` names the file to the user
    and `cells` gives where each of the notebook's code cells starts in the script.
    """

    path: str
    original: str
    candidate: str
    sites: tuple[Site, ...]
    rewrite: Callable[[frozenset[str]], str] | None = None
    baseline: str | None = None
    alternatives: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)  # project modules it imports, by path
    command: str = ""
    label: str = ""
    cells: Mapping[int, int] = field(default_factory=dict)  # a script's cell -> first line


@dataclass(frozen=True)
class Verdict:
    """What verification said about one site: a status, a one-line reason, and the evidence.

    `details` may hold: target, input_source (recorded/declared/synthesized, or run: a function without arguments, called), reference,
    reference_errors, calls, input_shapes, output_shapes, max_abs_err, max_rel_err, mismatch
    (path, why, shape, ...), contexts, round, compared (what a unit's run covered: returned,
    printed, files, left_out), determinism (why a unit's original ran only once), jax (the JAX
    version each side ran), removed_api.
    """

    status: Status
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the report form of this verdict."""
        return {"status": str(self.status), "reason": self.reason, **self.details}
