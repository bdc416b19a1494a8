"""The shared helper module in the code base's own style, and no import left unused behind it.

flax, optax, brax and chex are 2-space, 80-column projects (`pyink-indentation = 2`,
`line-length = 80`): the one `_pmap_compat.py` jaxmigrate writes for such a code base is laid out
as their formatter would, and a module whose only use of `jax` was `jax.pmap` does not keep an
`import jax` nothing reads (ruff F401; seen in 11 of scenic's test files).
"""

from __future__ import annotations

import ast
from pathlib import Path

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.pipeline.project import Project

TRAIN = """\
import functools

import jax


@functools.partial(jax.pmap, axis_name="batch")
def step(w, x):
  return w - 0.1 * jax.lax.pmean(x * w, "batch")
"""

LOSS = """\
import jax


def run(model, x):
  f = jax.pmap(model.loss, axis_name="batch")
  return f(x)
"""


def migrate(root: Path, name: str, text: str) -> tuple[str, dict[str, str]]:
    """Migrate `pkg/<name>` of the project at `root`; return its code and the project files."""
    path = root / "pkg" / name
    path.write_text(text)
    project = Project()
    result = migrate_source(
        text,
        options=Options(unsafe_fixes=True),
        path=str(path),
        home=project.home(path, text),
        project=project,
    )
    return result.code, {Path(f.path).name: f.text for f in result.files}


def make_project(root: Path, config: str) -> None:
    (root / "pyproject.toml").write_text(f'[project]\nname = "pkg"\n\n{config}')
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")


def test_the_shared_helper_takes_the_projects_width_and_indentation(tmp_path: Path) -> None:
    make_project(tmp_path, "[tool.pyink]\nline-length = 80\npyink-indentation = 2\n")
    code, files = migrate(tmp_path, "train.py", TRAIN)
    assert "from pkg._pmap_compat import shard_map_per_device" in code
    helper = files["_pmap_compat.py"]
    ast.parse(helper)
    lines = helper.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    body = lines[lines.index(next(x for x in lines if x.startswith("def "))) :]
    indents = {len(x) - len(x.lstrip()) for x in body if x.strip() and not x.startswith(" " * 4)}
    assert indents == {0, 2}, indents  # one level is two spaces, as the project writes it
    assert "jaxmigrate" in lines[0]  # the first line says who wrote it: later runs may update it


def test_a_four_space_88_column_project_keeps_its_layout(tmp_path: Path) -> None:
    make_project(tmp_path, "[tool.ruff]\nline-length = 88\n")
    _, files = migrate(tmp_path, "train.py", TRAIN.replace("\n  return", "\n    return"))
    lines = files["_pmap_compat.py"].splitlines()
    assert max(len(line) for line in lines) <= 88
    assert "    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)" in lines


def test_jax_imported_only_for_pmap_is_not_left_unused(tmp_path: Path) -> None:
    make_project(tmp_path, "")
    code, files = migrate(tmp_path, "loss.py", LOSS)
    assert "_pmap_compat.py" in files
    tree = ast.parse(code)
    imported = {
        a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert "jax" not in imported, code
    assert "shard_map_per_device(" in code


def test_jax_still_read_elsewhere_keeps_its_import(tmp_path: Path) -> None:
    make_project(tmp_path, "")
    code, _ = migrate(tmp_path, "loss.py", LOSS + "\n\ndef count():\n  return jax.device_count()\n")
    assert "import jax\n" in code


def test_a_helper_in_the_file_reads_numpy_under_a_name_the_module_does_not_rebind() -> None:
    # No project around the file: the helper is written into it. `np` is taken and the module
    # binds `numpy` to something else: `import numpy` would be rebound by `numpy = ...`.
    text = (
        'import jax\n\nnp = None\nnumpy = "a name of the module"\n\n\n'
        "def step(x):\n    return x * 2\n\n\ndef run(x):\n    return jax.pmap(step)(x)\n"
    )
    code = migrate_source(text, options=Options(unsafe_fixes=True)).code
    assert "import numpy as numpy_\n" in code, code
    assert "numpy_.reshape(pool[: numpy_.prod(shape)], shape)" in code
    assert "numpy.reshape(" not in code
