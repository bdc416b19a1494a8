"""The benchmarks time and count *this checkout's* jaxmigrate, run as `python -m jaxmigrate`.

An editable install of another clone (a CI run's, a colleague's worktree) answers that command
with its own code, and every figure would silently be another tree's. `require_checkout()`
stops the benchmark with a message when the interpreter would run other code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import jaxmigrate, jaxmigrate.codemods as c; print(jaxmigrate.__file__); print(c.__file__)"


def require_checkout(python: str = sys.executable) -> None:
    """Exit unless `python -m jaxmigrate` runs the sources of this checkout (engine and rules)."""
    done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=False)
    found = [Path(line).resolve() for line in done.stdout.split()]
    if done.returncode != 0 or len(found) != 2:
        sys.exit(f"{python} cannot import jaxmigrate: run `pip install -e .` in {ROOT}")
    wrong = [str(p) for p in found if not p.is_relative_to(ROOT)]
    if wrong:
        sys.exit(
            f"{python} runs jaxmigrate from {', '.join(wrong)}, not from this checkout ({ROOT}): "
            f"run `pip install -e .` in {ROOT} (or use its venv) before measuring"
        )
