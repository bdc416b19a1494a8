"""The interpreter the original side runs in: the JAX the code was written for.

`--reference-jax 0.4.30` asks for a virtual environment of the verification interpreter's
Python with `jax==0.4.30` and `jaxlib==0.4.30` (and the numpy pins that release needs), built
once with pip under the cache folder (`$JAXMIGRATE_CACHE_DIR`, else `$XDG_CACHE_HOME/jaxmigrate`,
else `~/.cache/jaxmigrate`), in `reference/py<python version>-jax<version>/`, and reused by every
later run. `--reference-python PATH` names such an interpreter instead. The original side (its
workers and the recorded command) runs there; the rewritten side keeps the target JAX. What
crosses between them is plain data: JSON requests and replies, pickles of numpy arrays and
Python values (`child.hostify`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

VERSION = re.compile(r"^\d+\.\d+(\.\d+)*$")
PIP_TIMEOUT = 1800.0


class ReferenceError(RuntimeError):
    """The reference interpreter could not be built or used; the message says why."""


def cache_home(env: Mapping[str, str] = os.environ) -> Path:
    """Return jaxmigrate's cache folder (outside any project: shared by every run)."""
    explicit = env.get("JAXMIGRATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxmigrate"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def requirements(jax_version: str) -> list[str]:
    """Return what pip installs for a reference JAX: jax, jaxlib, and the pins it needs.

    jaxlib before 0.4.26 was built against numpy 1 (`numpy<2`); before 0.4.17 jax used
    ml_dtypes' float8 names that ml_dtypes 0.3 renamed (`ml_dtypes<0.3`). Checked here: 0.4.13
    and 0.4.30.
    """
    if not VERSION.match(jax_version):
        raise ReferenceError(f"--reference-jax expects a release like 0.4.30, got {jax_version!r}")
    version = version_tuple(jax_version)
    pins = [f"jax=={jax_version}", f"jaxlib=={jax_version}"]
    if version < (0, 4, 26):
        pins.append("numpy<2")
    if version < (0, 4, 17):
        pins.append("ml_dtypes<0.3")
    return pins


def python_version(python: str) -> str:
    """Return `3.11.7` for the interpreter `python`; raise ReferenceError if it does not run."""
    try:
        done = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReferenceError(f"cannot run {python}: {exc}") from None
    if done.returncode != 0:
        raise ReferenceError(f"cannot run {python}: {done.stderr.strip()[-300:]}")
    return done.stdout.strip()


def jax_version_of(python: str) -> str | None:
    """Return the JAX version installed for `python` (from its metadata), or None."""
    code = (
        "from importlib import metadata as m\ntry: print(m.version('jax'))\nexcept Exception: pass"
    )
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def reference_dir(jax_version: str, base_python: str) -> Path:
    """Return the cache folder of the reference environment for this Python and JAX."""
    return cache_home() / "reference" / f"py{python_version(base_python)}-jax{jax_version}"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_reference(
    jax_version: str, base_python: str = sys.executable, say: Callable[[str], None] | None = None
) -> str:
    """Return the interpreter of the reference environment, building it first if needed.

    The build (a venv of `base_python` plus `requirements(jax_version)`, checked by importing
    JAX) happens once per Python version and JAX version, under a lock so that concurrent runs
    build it once; a failed build leaves nothing behind. Raises ReferenceError with pip's
    reason.
    """
    pins = requirements(jax_version)
    folder = reference_dir(jax_version, base_python)
    python = venv_python(folder / "venv")
    if (folder / "ready").is_file() and python.exists():
        return str(python)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "ready").is_file() and python.exists():
            return str(python)
        if say is not None:
            say(f"building the reference interpreter (JAX {jax_version}) in {folder}: once")
        shutil.rmtree(folder, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            build(scratch / "venv", base_python, pins, jax_version)
            os.replace(scratch, folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        (folder / "ready").write_text(" ".join(pins) + "\n", encoding="utf-8")
    return str(python)


def build(venv: Path, base_python: str, pins: list[str], jax_version: str) -> None:
    """Make the venv and install `pins` in it; raise ReferenceError with what went wrong."""
    steps = [
        [base_python, "-m", "venv", str(venv)],
        [
            str(venv_python(venv)),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *pins,
        ],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReferenceError(
                f"could not build the JAX {jax_version} reference: {exc}"
            ) from None
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
            telling = next(
                (ln for ln in reversed(lines) if "ERROR" in ln), lines[-1] if lines else ""
            )
            raise ReferenceError(
                f"could not build the JAX {jax_version} reference ({' '.join(step[2:4])}): "
                f"{telling.strip()[:300]}; pass --reference-python with an interpreter that has it"
            )
    found = jax_version_of(str(venv_python(venv)))
    if found != jax_version:
        raise ReferenceError(f"the JAX {jax_version} reference installed JAX {found}")


def resolve_reference(
    jax_version: str | None,
    python: str | None,
    base_python: str,
    say: Callable[[str], None] | None = None,
) -> str | None:
    """Return the interpreter of the original side: `python` if given, else the JAX
    `jax_version` reference (built if needed), else None (the original runs beside the rewrite).
    Given both, `python` must have that JAX. `python` must be the Python X.Y of `base_python`:
    the two sides exchange functions as code objects (`child.pickling`)."""
    if python:
        if shutil.which(python) is None and not Path(python).exists():
            raise ReferenceError(f"--reference-python {python}: no such interpreter")
        theirs, ours = python_version(python), python_version(base_python)
        if theirs.split(".")[:2] != ours.split(".")[:2]:
            raise ReferenceError(
                f"--reference-python {python} is Python {theirs}, the rewrite runs on Python "
                f"{ours}: both sides must be the same Python X.Y (functions travel between "
                "them as code objects)"
            )
        if jax_version:
            found = jax_version_of(python)
            if found != jax_version:
                raise ReferenceError(
                    f"--reference-python {python} has JAX {found or '(none)'}, "
                    f"not the --reference-jax {jax_version}"
                )
        return python
    if jax_version:
        return ensure_reference(jax_version, base_python, say)
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m jaxmigrate.verify.reference 0.4.30 [...]`: build (or find) the reference
    environments of these JAX releases for this interpreter's Python, ahead of a run (CI does)."""
    versions = sys.argv[1:] if argv is None else argv
    status = 0
    for version in versions:
        try:
            print(f"JAX {version}: {ensure_reference(version, sys.executable, print)}", flush=True)
        except ReferenceError as exc:
            print(f"JAX {version}: {exc}", file=sys.stderr, flush=True)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
