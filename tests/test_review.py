"""`jaxmigrate run --interactive` with answers piped on standard input: real files, real
subprocesses, and the engine's own rendering as the expected result."""

from __future__ import annotations

import ast
import io
import json
from dataclasses import replace
from pathlib import Path

import clitools
import pytest
from clitools import git
from review_cases import (
    GROUPED,
    PMAP,
    PROMPT,
    SAFE,
    SECOND,
    changed_lines,
    jm,
    progress_file,
    rendered,
)
from rich.console import Console

from jaxmigrate.model import Options, Status
from jaxmigrate.pipeline.files import process_file
from jaxmigrate.pipeline.runner import write_result
from jaxmigrate.review.session import Progress, Review, StreamKeys
from jaxmigrate.ui.review import RichPresenter
from jaxmigrate.verify import Verdict, annotate

FIXTURES = Path(__file__).parent / "fixtures_notebooks"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a.py").write_text(SAFE)
    (tmp_path / "b.py").write_text(SECOND)
    return tmp_path


@pytest.mark.parametrize("answers", ["y\nn\ny\nn\ny\n", "ynyny", "y n\nyn\n\n"])
def test_partial_acceptance_is_the_engine_rendering_of_exactly_those_sites(
    tree: Path, answers: str
) -> None:
    proc = jm("--no-verify", ".", cwd=tree, stdin=answers)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tree / "a.py").read_text()
    assert text == rendered(SAFE, [0, 2])
    assert text not in (SAFE, rendered(SAFE, [0, 1, 2, 3]))
    ast.parse(text)
    assert (tree / "b.py").read_text() == rendered(SECOND, [0])
    assert proc.stdout.count(PROMPT) == 5
    assert "wrote a.py: 2 of 4 site(s) applied" in proc.stdout
    assert not progress_file(tree).exists(), "a finished review leaves nothing to resume"


def test_each_prompt_shows_the_site_its_status_and_its_own_diff(tree: Path) -> None:
    proc = jm("--no-verify", "a.py", cwd=tree, stdin="n\ny\nq\n")
    first, second = proc.stdout.split(PROMPT)[:2]
    assert "[1/4] a.py:2:35 JM101 legacy-imports [safe]" in first
    assert "moved to `jax.sharding.Mesh`" in first and "not-needed" in first
    assert "-from jax.experimental.maps import Mesh\n+from jax.sharding import Mesh\n" in first
    assert len(changed_lines(first)) == 2, "only this site's change"
    assert " from jax.experimental.pjit import pjit\n" in first, "with a few lines of context"
    assert "[2/4] a.py:13:5 JM103 pjit" in second
    assert "-g = pjit(f)\n+g = jax.jit(f)\n" in second
    assert changed_lines(second) == ["-g = pjit(f)", "+g = jax.jit(f)"]
    assert "(Enter = y)" in second


def test_a_applies_the_rest_of_this_file_only(tree: Path) -> None:
    proc = jm("--no-verify", ".", cwd=tree, stdin="n\na\nn\n")
    assert proc.returncode == 0, proc.stderr
    assert (tree / "a.py").read_text() == rendered(SAFE, [1, 2, 3])
    assert (tree / "b.py").read_text() == SECOND
    assert proc.stdout.count(PROMPT) == 3


def test_d_skips_the_rest_of_this_file_only(tree: Path) -> None:
    proc = jm("--no-verify", ".", cwd=tree, stdin="y\nd\ny\n")
    assert (tree / "a.py").read_text() == rendered(SAFE, [0])
    assert (tree / "b.py").read_text() == rendered(SECOND, [0])
    assert proc.stdout.count(PROMPT) == 3


def test_big_a_applies_everything_remaining_without_asking(tree: Path) -> None:
    proc = jm("--no-verify", ".", cwd=tree, stdin="n\nA\n")
    assert (tree / "a.py").read_text() == rendered(SAFE, [1, 2, 3])
    assert (tree / "b.py").read_text() == rendered(SECOND, [0])
    assert proc.stdout.count(PROMPT) == 2


@pytest.mark.parametrize("stop", ["q\n", ""], ids=["q", "end-of-input"])
def test_quit_writes_what_was_accepted_and_resume_asks_only_the_rest(tree: Path, stop: str) -> None:
    proc = jm("--no-verify", ".", cwd=tree, stdin="y\nn\n" + stop)
    assert proc.returncode == 0, proc.stderr
    assert (tree / "a.py").read_text() == rendered(SAFE, [0])
    assert (tree / "b.py").read_text() == SECOND, "nothing else is written"
    assert "not applied: not reviewed" in proc.stdout
    assert progress_file(tree).exists()

    again = jm("--no-verify", ".", cwd=tree, stdin="y\ny\ny\n")
    # the accepted site is done (written); the rejected one is remembered across the write
    assert "resuming: 1 decision(s) remembered, 3 left to review" in again.stdout
    assert again.stdout.count(PROMPT) == 3
    assert "[1/3] a.py:" in again.stdout and "JM102" in again.stdout.split(PROMPT)[0]
    assert (tree / "a.py").read_text() == rendered(SAFE, [0, 2, 3]), "the rejected pjit stays"
    assert (tree / "b.py").read_text() == rendered(SECOND, [0])
    assert not progress_file(tree).exists()


def test_resume_keeps_answers_of_a_file_left_unwritten(tree: Path) -> None:
    jm("--no-verify", ".", cwd=tree, stdin="n\nn\nq\n")
    assert (tree / "a.py").read_text() == SAFE
    again = jm("--no-verify", ".", cwd=tree, stdin="a\ny\n")
    assert "resuming: 2 decision(s) remembered" in again.stdout
    assert (tree / "a.py").read_text() == rendered(SAFE, [2, 3])


def test_stale_answers_are_ignored_after_the_file_changes(tree: Path) -> None:
    jm("--no-verify", ".", cwd=tree, stdin="n\nn\nq\n")
    (tree / "a.py").write_text(SAFE + "# edited by hand\n")
    again = jm("--no-verify", ".", cwd=tree, stdin="y\nq\n")
    assert "forgot the answers for 1 file(s) changed since: a.py" in again.stdout
    assert "remembered" not in again.stdout
    assert "[1/5] a.py:2:35 JM101" in again.stdout, "asked again from the first site"


def test_explain_help_and_unknown_keys(tree: Path) -> None:
    proc = jm("--no-verify", "b.py", cwd=tree, stdin="e\n?\nx\nn\n")
    assert proc.returncode == 0
    assert "JM103 pjit (safe)" in proc.stdout and "jax.jit" in proc.stdout
    assert "Why" in proc.stdout, "the rule's documentation, as `jaxmigrate explain` prints it"
    for line in ("y  apply this site", "A  apply this site and everything remaining", "q  quit"):
        assert line in proc.stdout
    assert "Enter  the default, y: safe or verified" in proc.stdout
    assert "unknown key 'x'" in proc.stdout
    assert proc.stdout.count(PROMPT) == 4, "the same site is asked again after e, ? and x"
    assert (tree / "b.py").read_text() == SECOND


def test_unverified_unsafe_pmap_defaults_to_no(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(PMAP)
    proc = jm("--no-verify", ".", cwd=tmp_path, stdin="\n")
    assert "JM202 pmap [unsafe]" in proc.stdout
    assert "unverified: not run (--no-verify)" in proc.stdout
    assert "(Enter = n)" in proc.stdout
    assert (tmp_path / "p.py").read_text() == PMAP
    proc = jm("--no-verify", ".", cwd=tmp_path, stdin="y\n")
    assert proc.returncode == 0, proc.stderr
    batch = tmp_path / "batch"
    batch.mkdir()
    (batch / "p.py").write_text(PMAP)
    clitools.jm("run", "--unsafe-fixes", "--no-verify", "--no-cache", ".", cwd=batch)
    for name in ("p.py", "_pmap_compat.py"):  # as `run --unsafe-fixes` writes it
        assert (tmp_path / name).read_text() == (batch / name).read_text(), name


def test_a_group_is_one_prompt_all_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "g.py").write_text(GROUPED)
    proc = jm("--no-verify", ".", cwd=tmp_path, stdin="?\ny\n")
    assert proc.stdout.count("Apply these 2 sites?") == 2 and PROMPT not in proc.stdout
    assert "group of 2 sites, all or nothing" in proc.stdout
    assert "JM201 with-mesh [unsafe]" in proc.stdout and "JM103 pjit [safe]" in proc.stdout
    assert "(Enter = n)" in proc.stdout, "the group holds an unverified unsafe site"
    text = (tmp_path / "g.py").read_text()
    assert text == rendered(GROUPED, [0, 1], unsafe_fixes=True)
    assert "jax.set_mesh(mesh)" in text and "jax.jit(" in text


def test_dry_run_prompts_then_shows_the_accepted_result(tree: Path) -> None:
    proc = jm("--no-verify", "--dry-run", "a.py", cwd=tree, stdin="y\nn\nn\nn\n")
    assert proc.returncode == 0
    assert (tree / "a.py").read_text() == SAFE
    after = proc.stdout.split(PROMPT)[-1]
    assert "-from jax.experimental.maps import Mesh\n+from jax.sharding import Mesh\n" in after
    assert "+g = jax.jit(f)" not in after
    assert "would write a.py: 1 of 4 site(s) applied" in proc.stdout
    assert not progress_file(tree).exists(), "a dry run writes nothing, not even progress"


def test_a_notebook_is_reviewed_cell_by_cell_and_resumed(tmp_path: Path) -> None:
    original = (FIXTURES / "jupyterlab.ipynb").read_text()
    (tmp_path / "nb.ipynb").write_text(original)
    proc = jm("--no-verify", ".", cwd=tmp_path, stdin="y\nn\ny\nq\n")
    assert "[1/4] nb.ipynb[cell 2]:6:30 JM101" in proc.stdout
    assert "+++ b/nb.ipynb[cell 2]" in proc.stdout, "the diff is of the cell, not of the JSON"
    assert "Apply these 2 sites?" in proc.stdout.split("[3/4]")[1]
    text = (tmp_path / "nb.ipynb").read_text()
    assert text == rendered(original, [0, 2, 3], path="nb.ipynb", unsafe_fixes=True)
    json.loads(text)
    again = jm("--no-verify", ".", cwd=tmp_path, stdin="y\n")
    assert "resuming: 1 decision(s) remembered, 1 left to review" in again.stdout
    assert "[1/1] nb.ipynb[cell 6]:1:14 JM104" in again.stdout
    everything_but_one = [0, 2, 3, 4]
    expected = rendered(original, everything_but_one, path="nb.ipynb", unsafe_fixes=True)
    assert (tmp_path / "nb.ipynb").read_text() == expected


def test_dirty_files_are_refused_but_our_own_writes_resume(tree: Path) -> None:
    git(tree, "init", "-q")
    git(tree, "add", ".")
    git(tree, "commit", "-qm", "init")
    (tree / "b.py").write_text(SECOND + "# local edit\n")
    proc = jm("--no-verify", ".", cwd=tree, stdin="y\nn\nq\n")
    assert proc.returncode == 1
    assert "not reviewing 1 file(s) with uncommitted changes" in proc.stdout
    assert "b.py: failed: has uncommitted changes" in proc.stdout
    assert (tree / "b.py").read_text() == SECOND + "# local edit\n"
    assert (tree / "a.py").read_text() == rendered(SAFE, [0])
    # a.py now differs from git only by what the review wrote: the review goes on there
    again = jm("--no-verify", "a.py", cwd=tree, stdin="y\ny\n")
    assert again.returncode == 0, again.stdout
    assert "resuming: 1 decision(s) remembered, 2 left to review" in again.stdout
    assert (tree / "a.py").read_text() == rendered(SAFE, [0, 2, 3])
    assert jm("--no-verify", "--allow-dirty", "b.py", cwd=tree, stdin="y\n").returncode == 0
    assert (tree / "b.py").read_text() == rendered(SECOND + "# local edit\n", [0])


def test_a_failed_site_is_shown_but_never_applicable(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text(SAFE)
    result = process_file(path, Options())
    failed_key = result.sites[1].key
    verdict = Verdict(Status.FAILED, "outputs differ at out[0]", {"max_abs_err": 0.5})
    sites = annotate("a.py", result.sites, {("a.py", failed_key): verdict})
    result = replace(result, sites=sites)
    out = io.StringIO()
    presenter = RichPresenter(Console(file=out, width=200, no_color=True))
    review = Review(
        [result],
        Options(),
        presenter,
        StreamKeys(io.StringIO("y\ny\nn\ny\ny\n")),
        tmp_path,
        progress=Progress.load(tmp_path),
        write=write_result,
    )
    (done,) = review.run()
    shown = out.getvalue()
    failed_prompt = shown.split("[2/4]")[1].split("[3/4]")[0]
    assert "failed: outputs differ at out[0] (max abs err 0.5)" in failed_prompt
    assert "cannot be applied: failed sites are never written (y is not offered)" in failed_prompt
    assert "[n,a,d,A,q,e,?] (Enter = n)" in failed_prompt
    assert "cannot apply: it failed verification" in failed_prompt, "y is refused, asked again"
    assert path.read_text() == rendered(SAFE, [0, 2, 3])
    by_key = {s.key: s for s in done.sites}
    assert not by_key[failed_key].applied and by_key[failed_key].reason == "failed verification"


@pytest.mark.jax
def test_verification_runs_first_and_a_verified_site_defaults_to_yes(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(
        PMAP + "\n\ndef main():\n    return run(jax.numpy.arange(16.0).reshape(8, 2))\n"
    )
    proc = jm(".", cwd=tmp_path, stdin="\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified: agrees with the original" in proc.stdout
    assert "max abs err" in proc.stdout and "(Enter = y)" in proc.stdout
    assert "shard_map" in (tmp_path / "p.py").read_text()


def test_progress_file_is_versioned_json_keyed_by_path_hash_and_site(tree: Path) -> None:
    jm("--no-verify", "a.py", cwd=tree, stdin="n\n")
    data = json.loads(progress_file(tree).read_text())
    assert data["version"] == 1
    entry = data["files"]["a.py"]
    assert entry["decisions"] == {"JM101:2:35": "n"} and len(entry["sha256"]) == 64
    ignore = (tree / ".jaxmigrate_cache" / ".gitignore").read_text()
    assert "*" in ignore.splitlines(), "the cache folder is ignored by git wherever it is"
    progress_file(tree).write_text("{not json")
    proc = jm("--no-verify", "a.py", cwd=tree, stdin="q\n")
    assert "ignored unreadable" in proc.stdout and "[1/4]" in proc.stdout


# A code base's shared pmap helper -------------------------------------------------------------
TRAINER = """\
import functools

import jax
import numpy as np


@functools.partial(jax.pmap, axis_name="i")
def step(w, x):
    return w - 0.1 * jax.lax.pmean(x * w, "i")


def main():
    return np.asarray(step(np.ones((8, 3), np.float32), np.ones((8, 3), np.float32)))
"""


def _package(root: Path) -> Path:
    (root / "mylib").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "mylib"\n')
    (root / "mylib" / "__init__.py").write_text("")
    for name in ("train.py", "evaluate.py"):
        (root / "mylib" / name).write_text(TRAINER)
    return root


def test_a_reviewed_file_imports_the_code_bases_helper_as_the_batch_run_writes_it(
    tmp_path: Path,
) -> None:
    """The review renders with the reading of the code base the run and its verification make:
    the accepted faithful pmap imports the one shared helper module (written before the file,
    so that no written file imports a module that is not there), never a pasted copy."""
    reviewed, batch = _package(tmp_path / "reviewed"), _package(tmp_path / "batch")
    forced = ("--unsafe-fixes", "--no-verify", "--no-cache")
    proc = jm(*forced, ".", cwd=reviewed, stdin="y\nn\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "+from mylib._pmap_compat import shard_map_per_device" in proc.stdout
    assert "+def shard_map_per_device(" not in proc.stdout.split(PROMPT)[1]
    done = clitools.jm("run", *forced, ".", cwd=batch)
    assert done.returncode == 0, done.stdout + done.stderr
    evaluate, train = reviewed / "mylib" / "evaluate.py", reviewed / "mylib" / "train.py"
    assert evaluate.read_text() == (batch / "mylib" / "evaluate.py").read_text(), "accepted first"
    assert "from mylib._pmap_compat import shard_map_per_device" in evaluate.read_text()
    assert "def shard_map_per_device(" not in evaluate.read_text()
    assert train.read_text() == TRAINER, "rejected"
    helper = reviewed / "mylib" / "_pmap_compat.py"
    assert helper.read_text() == (batch / "mylib" / "_pmap_compat.py").read_text()
    assert "wrote mylib/evaluate.py: 1 of 1 site(s) applied; it imports mylib/_pmap_compat.py" in (
        proc.stdout
    )


def test_a_dry_run_review_shows_the_helper_module_it_would_create(tmp_path: Path) -> None:
    root = _package(tmp_path)
    proc = jm(
        "--unsafe-fixes", "--no-verify", "--no-cache", "--dry-run", ".", cwd=root, stdin="y\ny\n"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = proc.stdout.split(PROMPT)[-1]
    assert report.count("+def shard_map_per_device(") == 1, "the new module's diff, once"
    assert not (root / "mylib" / "_pmap_compat.py").exists()
    assert (root / "mylib" / "train.py").read_text() == TRAINER


def test_e_explains_the_skip_code_of_the_site_after_its_rule(tmp_path: Path) -> None:
    root = _package(tmp_path)
    proc = jm("--unsafe-fixes", "--no-verify", "mylib/train.py", cwd=root, stdin="e\nn\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rule = proc.stdout.index("JM202 pmap (unsafe)")
    skip = proc.stdout.index("PL401: a form JM202 pmap does not take")
    assert rule < skip, "the site's own reason last, nearest the prompt"
    assert "a result is read other than as device 0's copy" in proc.stdout[skip:]
    assert (root / "mylib" / "train.py").read_text() == TRAINER
