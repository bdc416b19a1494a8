"""Jupyter notebooks: cells migrated as one module, IPython lines kept, the JSON kept byte for byte.

Fixture pairs live in tests/fixtures_notebooks/: `<case>.ipynb` is what a user has (shaped as
JupyterLab, Colab and a Windows editor save them), `<case>.expected.ipynb` what
`jaxmigrate run --unsafe-fixes --no-verify` writes; a `noop_<why>.ipynb` must come out
byte-for-byte unchanged; `<case>.messages.txt` pins the sites and skips users read
(`[cell N]:line:col CODE message`). `pytest --update-fixtures` rewrites the expected files
(review the diff).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clitools import jm
from conftest import check_messages, jax_env, pinned_messages

from jaxmigrate.model import Bucket, Options
from jaxmigrate.pipeline.files import process_file
from jaxmigrate.pipeline.notebook import (
    NotebookError,
    cell_sources,
    mask,
    migrate_notebook,
    source_spans,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures_notebooks"
CASES = sorted(p for p in FIXTURES.glob("*.ipynb") if not p.name.endswith(".expected.ipynb"))
UNSAFE = Options(unsafe_fixes=True)


def expected_for(case: Path) -> Path:
    return case.with_name(case.name.replace(".ipynb", ".expected.ipynb"))


def without_sources(document: dict) -> dict:
    """The notebook with every cell's source blanked: what must survive a migration as it was."""
    cells = [{**c, "source": None} for c in document["cells"]]
    return {**document, "cells": cells}


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_fixture(case: Path, request: pytest.FixtureRequest) -> None:
    before = case.read_bytes()
    result = process_file(case, UNSAFE)
    assert result.bucket is not Bucket.FAILED, result.reason
    update = bool(request.config.getoption("--update-fixtures"))
    messages = case.with_name(case.stem + ".messages.txt")
    check_messages(messages, pinned_messages(result.sites, result.skips), update)
    after = (result.new_text or result.old_text or before.decode()).encode()
    if case.name.startswith("noop_"):
        assert after == before
        assert not expected_for(case).exists()
        return
    if request.config.getoption("--update-fixtures"):
        expected_for(case).write_bytes(after)
    assert after == expected_for(case).read_bytes()
    # outputs, metadata, key order and every other cell's JSON are kept
    old, new = json.loads(before), json.loads(after)
    assert list(old) == list(new)
    assert without_sources(old) == without_sources(new)
    # and a second run changes nothing more
    again = migrate_notebook(after.decode(), options=UNSAFE, path=case.name)
    assert again.code == after.decode()


@pytest.mark.parametrize("case", ["colab", "jupyterlab", "windows_strings"])
def test_only_sources_of_changed_cells_differ_in_the_bytes(case: str) -> None:
    before = (FIXTURES / f"{case}.ipynb").read_text(encoding="utf-8")
    after = expected_for(FIXTURES / f"{case}.ipynb").read_text(encoding="utf-8")
    assert outside_sources(before) == outside_sources(after)


def outside_sources(text: str) -> list[str]:
    """The JSON text between the cells' `source` values, which must never change."""
    spans = sorted(source_spans(text).values())
    edges = [0, *(i for span in spans for i in span), len(text)]
    return [text[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_spelling_of_untouched_json_is_kept() -> None:
    after = expected_for(FIXTURES / "colab.ipynb").read_text(encoding="utf-8")
    assert '"value": 0.25' in after and '"step": 1e-7' in after  # json.dumps writes 1e-07
    assert "caf\\u00e9" in after and "na\\u00efve" in after  # escaped, as the file had it


def test_windows_newlines_and_string_sources_are_kept() -> None:
    after = expected_for(FIXTURES / "windows_strings.ipynb").read_bytes()
    assert after.count(b"\r\n") == after.count(b"\n") and not after.endswith(b"\n")
    cell = json.loads(after)["cells"][0]["source"]
    assert isinstance(cell, str) and "jax.device_put(" in cell


def test_default_policy_applies_safe_sites_only() -> None:
    result = process_file(FIXTURES / "jupyterlab.ipynb", Options())
    applied = {s.code for s in result.sites if s.applied}
    pending = {s.code: s for s in result.sites if not s.applied}
    assert applied == {"JM101", "JM104"} and set(pending) == {"JM103", "JM201"}
    assert "not verified by execution" in pending["JM201"].details["verification"]
    assert "group" in pending["JM103"].reason  # the pjit goes with its `with mesh:`
    assert result.new_text is not None and "with mesh:" in result.new_text


def test_sites_report_cell_and_line() -> None:
    result = process_file(FIXTURES / "jupyterlab.ipynb", UNSAFE)
    places = [(s.code, s.cell, s.line) for s in result.sites]
    assert ("JM101", 2, 6) in places and ("JM103", 4, 8) in places and ("JM104", 6, 1) in places
    (skip,) = result.skips
    assert (skip.code, skip.cell, skip.line) == ("JM202", 5, 1)
    assert "%%time" in skip.reason
    assert result.sites[0].to_json("nb.ipynb")["cell"] == 2


def test_names_resolve_across_cells_and_unused_imports_go() -> None:
    cells = [
        ["import jax\n", "from jax.experimental.pjit import pjit"],
        ["x = 1"],
        ["f = pjit(g, in_axis_resources=None)"],
    ]
    result = migrate_notebook(notebook(cells), options=UNSAFE, path="nb.ipynb")
    sources = dict(cell_sources(result.code))
    assert sources == {1: "import jax", 2: "x = 1", 3: "f = jax.jit(g, in_shardings=None)"}


@pytest.mark.parametrize("first", [["!pip install -q jax"], ["x = 1"], ["%%bash\n", "ls"]])
def test_new_imports_go_after_the_first_imports_not_above_a_pip_cell(first: list[str]) -> None:
    cells = [first, ["import jax\n", "y = jax.device_put_replicated(1, jax.devices())"]]
    result = migrate_notebook(notebook(cells), options=Options(), path="nb.ipynb")
    sources = dict(cell_sources(result.code))
    assert sources[1] == "".join(first)
    assert sources[2].startswith("import jax\nimport jax.numpy as jnp\nimport numpy as np\n")
    assert [(s.cell, s.line) for s in result.sites] == [(2, 2)]


@pytest.mark.parametrize(
    "line",
    [
        "%matplotlib inline\n",
        "!pip install -q jax\n",
        "files = !ls data/\n",
        "out = %timeit -o f()\n",
        "?jax.pmap\n",
        "jax.pmap??\n",
        "  %time g()\n",
        "timeit -n 5 -r 5 pmap(jnp.dot)(mats, mats).block_until_ready()\n",  # automagic
        "time f(x)\n",
        "pip install flax\n",
    ],
)
def test_ipython_lines_are_masked_and_restored(line: str) -> None:
    source = f"import jax\n{line}y = 2"
    masked = mask(source)
    assert masked is not None and line.strip() not in masked.code
    compile(masked.code, "cell", "exec") if not line.startswith(" ") else None
    assert masked.restore(masked.code) == source


@pytest.mark.parametrize(
    "source",
    [
        "x = (a\n     % b)\n",  # modulo on a continuation line
        's = """\n!not a shell line\n%not a magic\n"""\n',  # inside a string
        "y = x  # why?\n",
        "z = 10 % 3\n",
        "a != b\n",
        "time = 3\n",  # a magic's name used as Python
        "time -x\n",
        "timeit(f, number=3)\n",
        "run (a,\n     b)\n",  # a magic's name opening a bracket: Python's call
        "ls\n",
    ],
)
def test_python_is_never_masked(source: str) -> None:
    masked = mask(source)
    assert masked is not None and masked.code == source and not masked.lines


def test_multiline_magic_and_indented_shell_line() -> None:
    source = "for d in devs:\n    !echo a \\\n  b\n    print(d)\n"
    masked = mask(source)
    assert masked is not None
    compile(masked.code, "cell", "exec")
    assert masked.restore(masked.code) == source
    assert mask("%%time\nx = 1") is None and mask("\n\n%%bash\necho") is None


def test_a_moved_ipython_line_fails_the_cell_not_the_batch() -> None:
    masked = mask("%time f()\nx = 1")
    assert masked is not None
    with pytest.raises(ValueError, match="moved or dropped"):
        masked.restore("x = 1")


def test_unparsable_cells() -> None:
    ok = [["import jax\n", "from jax.experimental.maps import Mesh"], ["cd ..\n", "ls -la"]]
    result = migrate_notebook(notebook(ok), options=UNSAFE, path="nb.ipynb")
    sources = dict(cell_sources(result.code))
    assert sources == {1: "import jax\nfrom jax.sharding import Mesh", 2: "cd ..\nls -la"}
    bad = [["import jax\n"], ["x = jax.pmap(f\n"]]
    with pytest.raises(NotebookError, match=r"^cell 2: cannot parse: line 1"):
        migrate_notebook(notebook(bad), options=UNSAFE, path="nb.ipynb")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"cells": [', "not valid notebook JSON: Expecting value at line 1, column 12"),
        ("", "not valid notebook JSON: Expecting value at line 1, column 1"),
        ("[1, 2]", "not a Jupyter notebook: the JSON is not an object"),
        ('{"metadata": {}}', "not a Jupyter notebook: no `cells` list"),
    ],
)
def test_broken_notebooks_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "nb.ipynb"
    path.write_text(text, encoding="utf-8")
    result = process_file(path, Options())
    assert (result.bucket, result.reason) == (Bucket.FAILED, message)


def test_nbformat3_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps({"worksheets": [{"cells": []}], "nbformat": 3}), encoding="utf-8")
    result = process_file(path, Options())
    assert result.bucket is Bucket.SKIPPED and "nbformat 3" in result.reason


def notebook(cells: list[list[str]]) -> str:
    document = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": c,
            }
            for c in cells
        ],
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1) + "\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for case in ("jupyterlab.ipynb", "noop_modern_odd_json.ipynb", "noop_r_kernel.ipynb"):
        shutil.copy(FIXTURES / case, tmp_path / case)
    (tmp_path / "broken.ipynb").write_text('{"cells": [', encoding="utf-8")
    return tmp_path


def test_cli_dry_run_names_cells_and_failures(project: Path) -> None:
    proc = jm("run", "--dry-run", "--no-verify", ".", cwd=project)
    assert proc.returncode == 1  # the broken notebook
    out = proc.stdout
    assert "--- a/jupyterlab.ipynb[cell 2]" in out and "+++ b/jupyterlab.ipynb[cell 6]" in out
    assert "jupyterlab.ipynb[cell 4]" in out and "[cell 4]\n" not in out  # unsafe: not applied
    assert "jupyterlab.ipynb[cell 4]:8:9 JM103" in out
    assert "jupyterlab.ipynb[cell 5]:1:1 JM202 pmap [skipped] in a %%time cell" in out
    assert "broken.ipynb: failed: not valid notebook JSON: Expecting value" in out
    assert "noop_r_kernel.ipynb: skipped: not a Python notebook (language: R)" in out
    assert '"cells"' not in out  # diffs of cells, never of the JSON


def test_cli_run_writes_notebooks_and_check_sees_them(project: Path) -> None:
    (project / "broken.ipynb").unlink()
    before = {p.name: p.read_bytes() for p in project.glob("*.ipynb")}
    assert jm("check", ".", cwd=project).returncode == 1
    proc = jm("run", "--no-verify", "--unsafe-fixes", "--allow-dirty", ".", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = expected_for(FIXTURES / "jupyterlab.ipynb").read_bytes()
    assert (project / "jupyterlab.ipynb").read_bytes() == expected
    for name in ("noop_modern_odd_json.ipynb", "noop_r_kernel.ipynb"):
        assert (project / name).read_bytes() == before[name]
    again = jm("check", ".", cwd=project)
    assert again.returncode == 0, again.stdout  # nothing left to rewrite ...
    assert "[cell 5]:1:1 JM202 pmap [skipped]" in again.stdout  # ... but the %%time cell is shown


def test_dirty_notebooks_are_refused(project: Path) -> None:
    (project / "broken.ipynb").unlink()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "."], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=project, check=True)
    nb = project / "jupyterlab.ipynb"
    edited = nb.read_bytes().replace(b'"scrolled": true', b'"scrolled": false')
    nb.write_bytes(edited)
    proc = jm("run", "--no-verify", ".", cwd=project)
    assert proc.returncode == 1 and "uncommitted changes" in proc.stdout
    assert nb.read_bytes() == edited
    assert jm("run", "--no-verify", "--allow-dirty", ".", cwd=project).returncode == 0
    assert b"jax.sharding" in nb.read_bytes()


PMAP_CELLS = [
    ["import jax\n", "import trainer\n"],
    ["step = jax.pmap(lambda x: jax.lax.psum(x, 'i'), 'i')\n"],
]


def code_base(tmp_path: Path) -> Path:
    """A code base with its main package, `trainer`, and a notebook beside it."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "notebooks").mkdir()
    return tmp_path


def test_a_notebook_importing_its_code_base_imports_the_helper(tmp_path: Path) -> None:
    """The helper is the code base's module: imported, never pasted into a cell."""
    path = code_base(tmp_path) / "notebooks" / "train.ipynb"
    path.write_text(notebook(PMAP_CELLS), encoding="utf-8")
    result = process_file(path, Options(unsafe_fixes=True, pmap_style="faithful"))
    assert result.bucket is Bucket.CHANGED, result.reason
    sources = dict(cell_sources(result.new_text or ""))
    assert "from trainer._pmap_compat import shard_map_per_device\n" in sources[1]
    assert "def shard_map_per_device" not in result.new_text
    assert [Path(f.path).name for f in result.files] == ["_pmap_compat.py"]
    assert "imported from `trainer._pmap_compat`: this notebook imports `trainer`" in (
        result.sites[0].message
    )


def test_a_notebook_importing_none_of_its_code_base_defines_the_helper_and_says_so(
    tmp_path: Path,
) -> None:
    path = code_base(tmp_path) / "notebooks" / "train.ipynb"
    path.write_text(notebook([["import jax\n"], PMAP_CELLS[1]]), encoding="utf-8")
    result = process_file(path, Options(unsafe_fixes=True, pmap_style="faithful"))
    assert "def shard_map_per_device" in (result.new_text or "")
    assert not result.files
    assert "the helper is defined in a cell: this notebook imports no package of its code base" in (
        result.sites[0].message
    )


RUN_CELLS = """\
import json, sys
import jax
import numpy as np
cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
space = {}
for cell in cells:
    source = "".join(cell["source"])
    lines = [line for line in source.splitlines() if not line.lstrip().startswith("%")]
    exec("\\n".join(lines), space)
print(json.dumps([np.asarray(x).tolist() for x in jax.tree.leaves((space["final"], space["losses"]))]))
"""


@pytest.mark.jax
def test_a_notebook_step_made_and_called_in_cells_keeps_its_numbers(tmp_path: Path) -> None:
    """The cells making and calling a step take the program-level form (`pmap_program_cells`):
    run in order, before and after, they give the same weights and losses."""
    script = tmp_path / "run_cells.py"
    script.write_text(RUN_CELLS)
    case = FIXTURES / "pmap_program_cells.ipynb"
    outputs = []
    for notebook in (case, expected_for(case)):
        done = subprocess.run(
            [sys.executable, str(script), str(notebook)],
            check=False,
            capture_output=True,
            text=True,
            env=jax_env(),
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(json.loads(done.stdout.splitlines()[-1]))
    migrated = "".join(
        "".join(c["source"]) for c in json.loads(expected_for(case).read_text())["cells"]
    )
    assert "jax.pmap" not in migrated and "replicate" not in migrated and "shard(" not in migrated
    before, after = outputs
    assert len(before) == len(after) == 4  # the weights, three losses
    for want, got in zip(before, after, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
