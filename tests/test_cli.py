"""The `jaxmigrate` command as a user runs it: real subprocesses over real files."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import jm

from jaxmigrate.registry import all_passes

LEGACY = "from jax.experimental.maps import Mesh\n\nmesh = Mesh(devices, ('x',))\n"
MIGRATED = "from jax.sharding import Mesh\n\nmesh = Mesh(devices, ('x',))\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "legacy.py").write_text(LEGACY)
    (tmp_path / "pkg" / "clean.py").write_text("import jax\n\nx = jax.numpy.ones(3)\n")
    return tmp_path


def test_help_is_instant_and_never_imports_jax(tmp_path: Path) -> None:
    code = (
        "import sys; from jaxmigrate.cli import app; from typer.testing import CliRunner;"
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output;"
        "r = CliRunner().invoke(app, ['run', '--dry-run', '.']);"
        "assert 'jax' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)"
    )
    (tmp_path / "a.py").write_text(LEGACY)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, check=False, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_dry_run_shows_diff_and_writes_nothing(tree: Path) -> None:
    proc = jm("run", "--dry-run", ".", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert "-from jax.experimental.maps import Mesh" in proc.stdout
    assert "+from jax.sharding import Mesh" in proc.stdout
    assert "JM101" in proc.stdout and "would change" in proc.stdout
    assert (tree / "pkg" / "legacy.py").read_text() == LEGACY


def test_run_writes_then_nothing_is_left(tree: Path) -> None:
    assert jm("check", ".", cwd=tree).returncode == 1
    proc = jm("run", "--allow-dirty", ".", cwd=tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tree / "pkg" / "legacy.py").read_text() == MIGRATED
    assert jm("check", ".", cwd=tree).returncode == 0
    again = jm("run", "--allow-dirty", "--dry-run", ".", cwd=tree)
    assert "would change │     0" in again.stdout or "would change |     0" in again.stdout


def test_one_bad_file_never_stops_the_batch(tree: Path) -> None:
    bad = tree / "pkg" / "broken.py"
    bad.write_bytes(b"from jax.experimental.maps import Mesh\ndef f(:\n")
    proc = jm("run", "--allow-dirty", ".", cwd=tree)
    assert proc.returncode == 1
    assert "broken.py" in proc.stdout and "cannot parse" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (tree / "pkg" / "legacy.py").read_text() == MIGRATED
    assert bad.read_bytes() == b"from jax.experimental.maps import Mesh\ndef f(:\n"


def test_missing_path_is_reported(tree: Path) -> None:
    proc = jm("run", "--dry-run", "nope.py", "pkg", cwd=tree)
    assert proc.returncode == 1
    assert "nope.py" in proc.stdout and "no such file" in proc.stdout


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbf" + LEGACY.encode(),
        LEGACY.replace("\n", "\r\n").encode(),
        b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + LEGACY.encode(),
    ],
    ids=["bom", "crlf", "latin1"],
)
def test_encoding_newlines_and_mode_are_kept(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "a.py"
    path.write_bytes(data)
    path.chmod(0o750)
    assert jm("run", "--allow-dirty", ".", cwd=tmp_path).returncode == 0
    expected = data.replace(b"jax.experimental.maps", b"jax.sharding")
    assert path.read_bytes() == expected
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


def test_suppression_comment(tmp_path: Path) -> None:
    source = "from jax.experimental.maps import Mesh  # jaxmigrate: skip[JM101]\n"
    (tmp_path / "a.py").write_text(source)
    proc = jm("run", "--allow-dirty", ".", cwd=tmp_path)
    assert proc.returncode == 0
    assert (tmp_path / "a.py").read_text() == source
    assert "suppressed" in proc.stdout


def test_refuses_dirty_git_files(tree: Path) -> None:
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tree, check=True)
    subprocess.run([*git, "add", "."], cwd=tree, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=tree, check=True)
    (tree / "pkg" / "legacy.py").write_text(LEGACY + "# local edit\n")
    proc = jm("run", ".", cwd=tree)
    assert proc.returncode == 1
    assert "uncommitted changes" in proc.stdout
    assert (tree / "pkg" / "legacy.py").read_text() == LEGACY + "# local edit\n"
    assert jm("run", "--allow-dirty", ".", cwd=tree).returncode == 0
    assert "jax.sharding" in (tree / "pkg" / "legacy.py").read_text()


def test_gitignore_and_excludes(tree: Path) -> None:
    (tree / ".gitignore").write_text("generated/\n")
    for folder in ("generated", ".venv", "vendored"):
        (tree / folder).mkdir()
        (tree / folder / "x.py").write_text(LEGACY)
    proc = jm("run", "--dry-run", "--exclude", "vendored", ".", cwd=tree)
    assert "pkg/legacy.py" in proc.stdout
    for folder in ("generated", ".venv", "vendored"):
        assert f"{folder}/x.py" not in proc.stdout


def test_select_ignore_and_unknown_rule(tree: Path) -> None:
    assert "JM101" not in jm("run", "--dry-run", "--ignore", "JM101", ".", cwd=tree).stdout
    assert "JM101" in jm("run", "--dry-run", "--select", "legacy-imports", ".", cwd=tree).stdout
    proc = jm("run", "--dry-run", "--select", "JM999", ".", cwd=tree)
    assert proc.returncode == 2 and "unknown rule" in proc.stderr


def test_pyproject_config_and_unknown_key(tree: Path) -> None:
    (tree / "pyproject.toml").write_text("[tool.jaxmigrate]\nignore = ['JM101']\n")
    assert "JM101" not in jm("run", "--dry-run", ".", cwd=tree).stdout
    (tree / "pyproject.toml").write_text("[tool.jaxmigrate]\nignroe = ['JM101']\n")
    proc = jm("run", "--dry-run", ".", cwd=tree)
    assert proc.returncode == 2 and "ignroe" in proc.stderr and "unknown key" in proc.stderr
    (tree / "pyproject.toml").write_text("[tool.jaxmigrate]\npmap-replicated = ['Evaluator.run']\n")
    proc = jm("run", "--dry-run", ".", cwd=tree)
    assert proc.returncode == 2 and "'Evaluator.run' is not a def and its parameters" in proc.stderr


def test_jobs_give_the_same_result(tree: Path) -> None:
    # growing sizes: the workers start the largest first, and the report still follows the tree
    for i in range(12):
        (tree / "pkg" / f"m{i:02}.py").write_text(LEGACY + "# padding\n" * (50 * i))
    one = jm("run", "--dry-run", "--report", "one.json", ".", cwd=tree)
    two = jm("run", "--dry-run", "--jobs", "2", "--report", "two.json", ".", cwd=tree)
    assert one.returncode == two.returncode == 0
    assert (
        json.loads((tree / "one.json").read_text())["files"]
        == json.loads((tree / "two.json").read_text())["files"]
    )


def test_json_report(tree: Path) -> None:
    proc = jm("run", "--dry-run", "--report", "-", "--format", "json", ".", cwd=tree)
    start = proc.stdout.index('{\n  "schema_version"')
    report = json.loads(proc.stdout[start : proc.stdout.rindex("}") + 1])
    assert report["schema_version"] == 1
    files = {f["path"]: f for f in report["files"]}
    site = files["pkg/legacy.py"]["sites"][0]
    assert {"code", "name", "path", "line", "col", "safety", "status", "applied", "message"} <= set(
        site
    )
    assert (site["code"], site["line"], site["status"]) == ("JM101", 1, "not-needed")
    assert report["summary"]["sites"]["found"] == 1


def test_rules_and_explain(tmp_path: Path) -> None:
    rules = jm("rules", cwd=tmp_path)
    assert rules.returncode == 0
    for code in ("JM101", "JM102", "JM103", "JM201", "JM202"):
        assert code in rules.stdout
    explain = jm("explain", "legacy-imports", cwd=tmp_path)
    assert explain.returncode == 0 and "Why" in explain.stdout
    assert jm("explain", "JM999", cwd=tmp_path).returncode == 2


README = Path(__file__).resolve().parent.parent / "README.md"
RULES_BLOCK = re.compile(r"(<!-- rules: .*? -->\n)(.*?)(<!-- end of rules -->)", re.DOTALL)


def test_readme_rules_table_is_what_jaxmigrate_rules_prints(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The README's table is `jaxmigrate rules --markdown`; both list the rows of `rules`."""
    markdown = jm("rules", "--markdown", cwd=tmp_path)
    assert markdown.returncode == 0, markdown.stderr
    readme = README.read_text(encoding="utf-8")
    match = RULES_BLOCK.search(readme)
    assert match, "README.md has no generated rules block"
    if request.config.getoption("--update-fixtures"):
        readme = readme[: match.start(2)] + markdown.stdout + readme[match.end(2) :]
        README.write_text(readme, encoding="utf-8")
    assert match.group(2) == markdown.stdout, "README rules table is stale (--update-fixtures)"
    rows = [line.split(" | ") for line in markdown.stdout.splitlines()[2:]]
    assert [row[0].lstrip("| ") for row in rows] == [p.CODE for p in all_passes()]
    table = jm("rules", cwd=tmp_path).stdout
    for row in rows:
        code, name, safety, needs = (cell.strip("| ") for cell in row[:4])
        assert re.search(rf"{code}\s.*{name}\s.*{safety}\s.*{needs}", table), code


@pytest.mark.jax
def test_verification_works_from_another_working_directory(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "step.py").write_text(
        "import jax\n\n\ndef double(x):\n    return x * 2\n\n\n"
        "def main():\n    return jax.pmap(double)(jax.numpy.ones((8, 3)))\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = jm("run", "--dry-run", str(project / "step.py"), cwd=elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "JM202 pmap [unsafe, verified]" in proc.stdout, proc.stdout


@pytest.mark.jax
def test_a_project_whose_imports_are_not_installed_is_told_what_to_install(
    tmp_path: Path,
) -> None:
    """A first run in a project whose requirements are not installed where its code runs
    (flax's examples without `clu`): each unverified site's hint names the module to install,
    not a `--verify-with` that would fail the same way, and one line under the tables counts
    them by module."""
    (tmp_path / "step.py").write_text(
        "import jax\nimport jaxmigrate_absent_requirement\n\n\n"
        "def double(x):\n    return x * 2\n\n\n"
        "def main():\n    return jax.pmap(double)(jax.numpy.ones((8, 3)))\n"
    )
    proc = jm("run", "--dry-run", "step.py", "--report", "report.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "JM202 pmap [unsafe, unverified]" in out, proc.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    site = report["files"][0]["sites"][0]
    assert site["details"]["missing_module"] == "jaxmigrate_absent_requirement", site
    hint = (
        "to apply: install `jaxmigrate_absent_requirement` where the project's code runs "
        "(`--python`) and run again, or --unsafe-fixes"
    )
    assert hint in out, proc.stdout
    assert (
        "Not verified (1): the original could not run, a module it imports is not installed: "
        "`jaxmigrate_absent_requirement` (1); install the project's requirements"
    ) in out, proc.stdout


def test_every_test_runs_the_cli_through_clitools() -> None:
    """One runner (tests/clitools.py) sets the terminal and the timeout for every CLI test."""
    spawn = re.compile(r"""["']-m["'],\s*["']jaxmigrate["']""")
    tests = Path(__file__).resolve().parent
    own = [
        path.relative_to(tests).as_posix()
        for path in sorted(tests.rglob("*.py"))
        if path.name != "clitools.py" and spawn.search(path.read_text(encoding="utf-8"))
    ]
    assert own == [], "run the CLI with clitools.jm (or clitools.command for Popen/pty)"
