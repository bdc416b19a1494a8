"""A program-level group whose function cannot be replayed: its other sites are judged by what
the `--verify-with` command prints (`verify.groups`).

`train` below, like flax lm1b's `train_and_evaluate` driven inside `tfds.testing.mock_data()`,
reads its data from a context only the command enters: replayed alone it raises. Its step is
compared by the calls the command made of it, in the flat layout; the replication deleted, the
split made a sharded batch and the readback deleted create nothing to record. Before, they
stayed `unverified`, and the group, written only whole, was never written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from clitools import jm
from conftest import jax_env

from jaxmigrate.model import Options
from jaxmigrate.pipeline.engine import migrate_source
from jaxmigrate.verify import VerifyConfig, VerifyRequest, verify

pytestmark = [pytest.mark.jax, pytest.mark.one_jax]  # not again on JAX 0.12 (.ci/run)

DATA = textwrap.dedent("""
    from contextlib import contextmanager

    import numpy as np

    ACTIVE = []


    @contextmanager
    def mocked():
        ACTIVE.append(True)
        yield
        ACTIVE.pop()


    def load():
        if not ACTIVE:
            raise KeyError("splits is empty: the dataset has not been generated")
        return np.arange(32, dtype=np.float32).reshape(16, 2)
    """)
TRAIN = textwrap.dedent("""
    import time

    import jax
    import numpy as np
    from flax import jax_utils
    from flax.training import common_utils

    from pkg import data


    def update(w, x):
        return w + jax.lax.pmean(x.sum(), "batch")


    def train(steps=2):
        x = data.load()
        w = jax_utils.replicate(np.float32(3.0))
        p_update = jax.pmap(update, axis_name="batch")
        for i in range(steps):
            w = p_update(w, common_utils.shard(x))
            print(f"step {i} w {float(jax_utils.unreplicate(w)):.6g}")
        print(f"finished at {time.time_ns()}")
    """)
DRIVE = "from pkg import data\nfrom pkg.train import train\n\nwith data.mocked():\n    train()\n"
COMMAND = f"{sys.executable} drive.py"


def project(root: Path, train: str = TRAIN) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "data.py").write_text(DATA)
    (root / "pkg" / "train.py").write_text(train)
    (root / "drive.py").write_text(DRIVE)
    return root


def shown(root: Path) -> list[str]:
    """What `python drive.py` prints in `root`, less its clock reading."""
    env = jax_env(8)
    proc = subprocess.run(
        [sys.executable, "drive.py"], cwd=root, capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if not line.startswith("finished at")]


def test_a_group_in_a_function_that_cannot_be_replayed_is_written_verified(
    tmp_path: Path,
) -> None:
    root = project(tmp_path / "project")
    before = shown(root)
    proc = jm("run", "--verify-with", COMMAND, "--target-jax", "0.8", "pkg/train.py", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("[unsafe, verified]") == 4, out  # the step, and the three edits
    assert f"`{COMMAND}` prints the same on both trees (compared: 2 printed line(s);" in out, out
    assert "printed line(s) 3 differ between two runs of the original" in out, out
    written = (root / "pkg" / "train.py").read_text()
    assert "jax.shard_map(" in written and "jax_utils" not in written, written
    assert shown(root) == before == ["step 0 w 65", "step 1 w 127"]


def wrong_readback(tmp_path: Path) -> tuple[Path, VerifyRequest]:
    """The right rewrite with its readback made wrong: the value read is the copies' sum, as if
    the stacked copies were still there. Only what the command prints shows it."""
    root = project(tmp_path / "project")
    migrated = migrate_source(TRAIN, options=Options(unsafe_fixes=True, target_jax=(0, 8)))
    right = "float(w)"
    assert right in migrated.code, migrated.code
    wrong = migrated.code.replace(right, "float(w * jax.local_device_count())")
    return root, VerifyRequest("pkg/train.py", TRAIN, wrong, tuple(migrated.sites))


def test_a_wrong_readback_in_such_a_group_fails(tmp_path: Path) -> None:
    root, request = wrong_readback(tmp_path)
    config = VerifyConfig(root=root, timeout=120.0, jobs=1, verify_with=COMMAND)
    verdicts = verify([request], config)
    by_message = {site.key: verdicts[(request.path, site.key)] for site in request.sites}
    readback = next(s for s in request.sites if "readback" in s.message)
    verdict = by_message[readback.key]
    assert verdict.status.value == "failed", verdict
    assert "differs on the rewritten tree: printed line 1 is `step 0 w 520`" in verdict.reason
    # its step's calls agreed, but the command ran it with the wrong readback: not the text
    # that will be written (the group falls back to the faithful form, and is verified again)
    step = by_message[next(s for s in request.sites if "layout" in s.details).key]
    assert step.status.value == "unverified", step
    assert "not re-verified without the failed sites of its file" in step.reason, step


QUIET = TRAIN.replace('print(f"step {i}', '_ = (f"step {i}').replace(
    'print(f"finished', '_ = (f"finished'
)  # `train` prints nothing


def quiet_edits(tmp_path: Path, drive: str = DRIVE) -> list[str]:
    """Verify the quiet `train` with `drive` as `drive.py`; return the reasons of its edits
    (the sites that are not steps), each unverified."""
    root = project(tmp_path / "project", QUIET)
    (root / "drive.py").write_text(drive)
    migrated = migrate_source(QUIET, options=Options(unsafe_fixes=True, target_jax=(0, 8)))
    request = VerifyRequest("pkg/train.py", QUIET, migrated.code, tuple(migrated.sites))
    config = VerifyConfig(root=root, timeout=120.0, jobs=1, verify_with=COMMAND)
    verdicts = verify([request], config)
    edits = [verdicts[(request.path, s.key)] for s in request.sites if "layout" not in s.details]
    assert edits
    assert all(verdict.status.value == "unverified" for verdict in edits), edits
    return [verdict.reason for verdict in edits]


def test_a_command_that_prints_nothing_leaves_the_group_unverified(tmp_path: Path) -> None:
    for reason in quiet_edits(tmp_path):
        assert f"`{COMMAND}` printed no line two runs of the original agree on" in reason


def test_a_banner_printed_before_the_call_does_not_verify_the_group(tmp_path: Path) -> None:
    """The command prints a banner before calling `train`. Both trees print the same banner,
    but it shows nothing `train` computed: its edits stay unverified. Where the call began is
    known by the bytes the process had printed then (its standard output is the file
    jaxmigrate gave it)."""
    for reason in quiet_edits(tmp_path, 'print("training on mock data")\n' + DRIVE):
        before = "each line compared was printed before the call of `train` that ran line"
        assert before in reason, reason


def test_a_group_whose_function_did_not_run_an_edit_is_not_judged_by_the_output(
    tmp_path: Path,
) -> None:
    """The command calls `train` with `steps=0`: the step and the split never run. The call of
    `train` is not recorded (it missed sites), so nothing is judged by what it prints."""
    root = project(tmp_path / "project")
    (root / "drive.py").write_text(DRIVE.replace("train()", "train(steps=0)"))
    proc = jm("run", "--dry-run", "--verify-with", COMMAND, "--target-jax", "0.8", ".", cwd=root)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "verified]" not in proc.stdout.replace("unverified]", ""), proc.stdout
    assert "prints the same on both trees" not in proc.stdout, proc.stdout
    # and the site says why the command's call of `train` was not recorded
    missed = f"`{COMMAND}` called `train`, but its call(s) never ran the site's lines"
    assert missed in proc.stdout, proc.stdout
    shutil.rmtree(root)


def test_a_call_that_missed_the_sites_is_named_where_no_inputs_were_found(
    tmp_path: Path,
) -> None:
    """`train(config)` takes what no input can be synthesized for, and the command's call of
    it took another path than the sites: the reason says the call did not run them, not that
    the command made no call of it (big_vision's `main(argv)` with checkpoints off)."""
    configured = TRAIN.replace(
        "def train(steps=2):", "def train(config):\n    steps = config.steps"
    )
    root = project(tmp_path / "project", configured)
    drive = DRIVE.replace("train()", "train(SimpleNamespace(steps=0))")
    (root / "drive.py").write_text("from types import SimpleNamespace\n" + drive)
    proc = jm("run", "--dry-run", "--verify-with", COMMAND, "--target-jax", "0.8", ".", cwd=root)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert f"no inputs for `train`: `{COMMAND}` called `train`, but its call(s) never ran" in out
    assert f"`{COMMAND}` made no call of it" not in out, proc.stdout


METHOD = (
    TRAIN.replace("def train(steps=2):", "class Trainer:\n    def train(self, steps=2):")
    .replace("\n    ", "\n        ")
    .replace("class Trainer:\n        def", "class Trainer:\n    def")
)  # big_vision's `Evaluator.run`: the same program as a method
METHOD_DRIVE = DRIVE.replace("import train", "import Trainer").replace(
    "train()", "Trainer().train()"
)
# ... and as a generator the command iterates, printing what it yields
GENERATOR = METHOD.replace('print(f"step {i}', 'yield (f"step {i}').replace(
    'print(f"finished', 'yield (f"finished'
)
GENERATOR_DRIVE = METHOD_DRIVE.replace(
    "Trainer().train()", "for line in Trainer().train():\n        print(line)"
)


EVALUATOR = textwrap.dedent("""
    import jax
    import numpy as np
    from flax.training import common_utils


    def evaluate(w, x):
        return jax.lax.psum((x * w).sum(), "batch")


    class Evaluator:
        def run(self, w, steps=2):
            x = np.arange(32, dtype=np.float32).reshape(16, 2)
            p_eval = jax.pmap(evaluate, axis_name="batch")
            for i in range(steps):
                total = p_eval(w, common_utils.shard(x + i))
                yield f"step {i} total {float(total[0]):.6g}"
    """)
EVALUATOR_DRIVE = """\
import numpy as np
from flax import jax_utils

from pkg.train import Evaluator

for line in Evaluator().run(jax_utils.replicate(np.float32(3.0))):
    print(line)
"""


def test_a_groups_edits_in_methods_and_generators_are_judged_by_what_the_command_prints(
    tmp_path: Path,
) -> None:
    """Four programs, a group each, driven by one command: a method (big_vision's
    `Evaluator.run`), a generator method the command iterates (its body runs after the call
    returned: the watch follows each `next`), a module-level generator (its call was noted as
    having missed its sites), and a method converting a declared argument on its header (run
    with every call). Each step verifies by its calls, each edit by what the command prints
    once a call of its method or function ran it; they are written, and the written program
    prints the same."""
    root = project(tmp_path / "project", METHOD)
    stream = GENERATOR.replace("class Trainer:", "class Stream:").replace("step {i}", "gen {i}")
    lines = TRAIN.replace('print(f"step {i}', 'yield (f"mod {i}').replace(
        'print(f"finished', 'yield (f"finished'
    )
    (root / "pkg" / "stream.py").write_text(stream)
    (root / "pkg" / "lines.py").write_text(lines.replace("def train(", "def train_lines("))
    (root / "pkg" / "ev.py").write_text(EVALUATOR)
    (root / "pyproject.toml").write_text(
        '[tool.jaxmigrate]\npmap-replicated = ["Evaluator.run(w)"]\nclosed-code-base = true\n'
    )
    (root / "drive.py").write_text(
        textwrap.dedent("""\
            import numpy as np
            from flax import jax_utils

            from pkg import data
            from pkg.ev import Evaluator
            from pkg.lines import train_lines
            from pkg.stream import Stream
            from pkg.train import Trainer

            with data.mocked():
                Trainer().train()
                for line in Stream().train():
                    print(line)
                for line in train_lines():
                    print(line)
            for line in Evaluator().run(jax_utils.replicate(np.float32(3.0))):
                print(line)
            """)
    )
    before = shown(root)
    assert before == [
        *["step 0 w 65", "step 1 w 127", "gen 0 w 65", "gen 1 w 127"],
        *["mod 0 w 65", "mod 1 w 127", "step 0 total 1488", "step 1 total 1584"],
    ]
    proc = jm("run", "--verify-with", COMMAND, "--target-jax", "0.8", "pkg", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert out.count("[unsafe, verified]") == 16, proc.stdout
    for function in ("Trainer.train", "Stream.train", "train_lines"):
        assert out.count(f"a call of `{function}` ran its line") == 3, (function, proc.stdout)
    assert "a call of `Evaluator.run` ran its line 12," in out, proc.stdout  # the header's
    written = {name: (root / "pkg" / name).read_text() for name in ("train.py", "ev.py")}
    assert "jax.shard_map(" in written["train.py"] and "jax_utils" not in written["train.py"]
    assert "from_device_copies(w)" in written["ev.py"]
    assert shown(root) == before


def test_a_method_whose_calls_miss_the_edits_says_so(tmp_path: Path) -> None:
    """`train(steps=0)` never runs the step, the split and the readback: nothing is judged by
    what the command prints, and the edits say which lines its call never ran."""
    root = project(tmp_path / "project", GENERATOR)
    (root / "drive.py").write_text(GENERATOR_DRIVE.replace(".train()", ".train(steps=0)"))
    proc = jm("run", "--dry-run", "--verify-with", COMMAND, "--target-jax", "0.8", ".", cwd=root)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "prints the same on both trees" not in out, proc.stdout
    missed = (
        "what the command prints judges them once a call of `Trainer.train` ran them: "
        f"`{COMMAND}` called `Trainer.train`, but its call(s) never ran the site's lines"
    )
    assert out.count(missed) == 3, proc.stdout


def test_a_command_under_a_tracer_leaves_the_groups_edits_unverified(tmp_path: Path) -> None:
    """Under another tracer (a debugger, a coverage tool) the recorder watches no line: the call
    of `train` is recorded without proof that it ran the edits, so what the command prints does
    not judge them, though every line ran and the step verifies by its calls."""
    root = project(tmp_path / "project")
    traced = "import sys\n\nsys.settrace(lambda *args: None)\n" + DRIVE
    (root / "drive.py").write_text(traced)
    proc = jm("run", "--dry-run", "--verify-with", COMMAND, "--target-jax", "0.8", ".", cwd=root)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert proc.stdout.count("[unsafe, verified]") == 1, proc.stdout  # the step alone
    assert proc.stdout.count("[unsafe, unverified]") == 3, proc.stdout
    assert "prints the same on both trees" not in proc.stdout, proc.stdout


def two_process_run(root: Path) -> subprocess.CompletedProcess[str]:
    """`jaxmigrate run --dry-run --verify-with COMMAND --processes 2` in `root`, which ends."""
    proc = jm(
        "run", "--dry-run", "--verify-with", COMMAND, "--processes", "2", "--target-jax", "0.8",
        ".", cwd=root,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc


def test_such_a_group_is_verified_on_a_two_process_job(tmp_path: Path) -> None:
    """Each process's printed lines are compared with its own (gloo's log lines aside): the
    rewrite's global batch is each process's rows, as pmap's stacked batch was."""
    root = project(tmp_path / "project")
    proc = two_process_run(root)
    assert proc.stdout.count("[unsafe, verified]") == 4, proc.stdout
    assert "prints the same on both trees (compared: 4 printed line(s);" in proc.stdout
    assert "(process 1 of 2)" in proc.stdout, proc.stdout  # its clock reading, left out


def test_a_groups_edits_in_a_generator_are_verified_on_a_two_process_job(tmp_path: Path) -> None:
    root = project(tmp_path / "project", GENERATOR)
    (root / "drive.py").write_text(GENERATOR_DRIVE)
    proc = two_process_run(root)
    assert proc.stdout.count("[unsafe, verified]") == 4, proc.stdout
    assert proc.stdout.count("a call of `Trainer.train` ran its line") == 3, proc.stdout


def test_a_group_whose_readback_runs_on_process_0_alone_is_verified_on_two_processes(
    tmp_path: Path,
) -> None:
    """big_vision's `main` logs and checkpoints on process 0 alone: on process 1 its calls
    never run those sites. What process 0 prints shows them, and process 1's lines are
    compared too: the group is verified. Before, every process had to run every site."""
    logged = TRAIN.replace(
        '        print(f"step {i}',
        '        if jax.process_index() == 0:\n            print(f"step {i}',
    )
    assert "if jax.process_index() == 0:" in logged
    root = project(tmp_path / "project", logged)
    proc = two_process_run(root)
    assert proc.stdout.count("[unsafe, verified]") == 4, proc.stdout
    assert "prints the same on both trees (compared: 2 printed line(s);" in proc.stdout


def test_what_a_command_printed_is_read_per_process_and_not_past_the_limit(tmp_path: Path) -> None:
    """`recording.printed` reads each process's standard output as the comparison takes it:
    gloo's log lines dropped, the side's copy of the tree written `<tree>`, and a process that
    printed more than the limit is not compared at all (None), rather than cut mid-line."""
    from jaxmigrate.verify import recording
    from jaxmigrate.verify.workspace import Workspace

    ws = Workspace(tmp_path)
    ws.logs.mkdir()
    ws.candidate.mkdir()
    tree = recording.scratch(ws, "candidate")
    first, second = recording.stdout_files(ws, "candidate", 2)
    first.write_text(f"[Gloo] Rank 0 is connected to 1 peer ranks. \nloss 0.5 in {tree}/out\n")
    second.write_bytes(b"x" * (recording.PRINTED_LIMIT + 1))
    assert recording.printed(ws, "candidate", 2) == (("loss 0.5 in <tree>/out",), None)


def test_a_failed_command_is_quoted_from_the_stream_that_says_why(tmp_path: Path) -> None:
    """Standard output and standard error go to files of their own: a Python traceback is
    quoted from standard error even when the program printed after it, a test runner's
    summary from standard output."""
    from jaxmigrate.verify import recording

    log, out = tmp_path / "verify-with.log", tmp_path / "verify-with.stdout"
    log.write_text("W tf: a warning\nTraceback (most recent call last):\n  ...\nKeyError: 'x'\n")
    out.write_text("loss 0.5\n")
    assert recording.failure_tail(log, out).endswith("KeyError: 'x'")
    log.write_text("W tf: a warning\n")
    out.write_text("FAILED test_a.py::test_b - assert 1 == 2\n1 failed in 0.1s\n")
    assert recording.failure_tail(log, out).endswith("1 failed in 0.1s")
    out.write_text("")
    assert recording.failure_tail(log, out).endswith("W tf: a warning")


def test_a_group_is_a_files_own(tmp_path: Path) -> None:
    """A group's id is its step's position in its file, so two files may share one: the steps
    verified in `a.py` say nothing of `b.py`'s group, whose edit is not judged by the output."""
    from jaxmigrate.model import Safety, Site, Status
    from jaxmigrate.verify import groups
    from jaxmigrate.verify.bound import SHADOW
    from jaxmigrate.verify.config import Verdict
    from jaxmigrate.verify.planner import Plan
    from jaxmigrate.verify.recording import Recording
    from jaxmigrate.verify.targets import Kind, Target

    layout = {"layout": {"line": 3, "end_line": 3}}
    group = "JM202:program:3:11"

    def plan(path: str, id_: str, *sites: Site) -> Plan:
        request = VerifyRequest(path, "", "", sites)
        target = Target(Kind.FUNCTION, "train", 1, 1)
        return Plan(id_, request, sites, target, path[:-3], "train", ())

    step = Site("JM202", "pmap", 3, 11, Safety.UNSAFE, "pmap", key="s", group=group, details=layout)
    edit = Site("JM202", "pmap", 4, 8, Safety.UNSAFE, "pmap", key="e", group=group)
    a_step, b_step = plan("a.py", f"a{SHADOW}0", step), plan("b.py", f"b{SHADOW}0", step)
    b_edit = plan("b.py", f"b{SHADOW}1", edit)
    functions = [plan("a.py", "a", step, edit), plan("b.py", "b", step, edit)]
    unverified = Verdict(Status.UNVERIFIED, "the original cannot run", {})
    verdicts = {
        "a": unverified,
        "b": unverified,
        a_step.id: Verdict(Status.VERIFIED, "made the same 2 call(s)", {}),
        b_step.id: Verdict(Status.UNVERIFIED, "the runs diverged before the site", {}),
    }
    judged = [*functions, a_step, b_step]
    assert groups.steps_verified(judged, verdicts) == {("a.py", group)}
    recording = Recording(ran={"a": (0,), "b": (0,)})
    by_id = {p.id: p for p in functions}
    assert groups.pending([b_edit], judged, verdicts, recording, by_id) == []
    a_edit = plan("a.py", f"a{SHADOW}1", edit)
    found = groups.pending([a_edit, b_edit], judged, verdicts, recording, by_id)
    assert found == [groups.Edit(a_edit, "a", "train")]


def test_which_group_edits_a_method_watch_covers() -> None:
    """A watch covers a method of a module-level class: the edits' statements a call must run,
    less an edit on the method's header (run with every call). An edit in a function nested in
    a method, or in an `async def`, has none, and its reason says what is judged."""
    from jaxmigrate.model import Safety, Site
    from jaxmigrate.verify.bound import edit_judged
    from jaxmigrate.verify.planner import Plan
    from jaxmigrate.verify.recording import Recording, method_watch
    from jaxmigrate.verify.targets import Kind, Target

    source = textwrap.dedent("""\
        class Evaluator:
            def run(self, params):
                total = params[0]
                yield total

            def nested(self):
                def inner(x):
                    return x[0]
                return inner

            async def later(self, x):
                return x[0]
        """)

    def plan(*lines: int) -> Plan:
        sites = tuple(
            Site("JM202", "pmap", n, 5, Safety.UNSAFE, "edit", key=f"e{n}", group="g")
            for n in lines
        )
        request = VerifyRequest("pkg/ev.py", source, source, sites)
        return Plan("t1", request, sites, Target(Kind.BOUND, "Evaluator", 1, 1), "pkg.ev", "", ())

    watch = method_watch(plan(2, 3))
    assert watch is not None and watch.qualname == "Evaluator.run"
    assert watch.spans == ((3, 3),)  # the header's edit runs with every call
    assert watch.id == method_watch(plan(3)).id  # type: ignore[union-attr]  # one per method
    for alone in (8, 12):
        assert method_watch(plan(alone)) is None
        said = edit_judged(plan(alone), Recording(), "python drive.py")
        assert said.endswith("a method of a module-level class, only"), said
    missed = Recording(missed={watch.id: "never ran the site's line 3"})
    said = edit_judged(plan(3), missed, "python drive.py")
    assert said.endswith(
        "`python drive.py` called `Evaluator.run`, but its call(s) never ran the site's line 3"
    ), said


def two_groups(tmp_path: Path) -> tuple[Path, str]:
    """A project with two files, a group each, both judged by what the command prints: a
    function (`pkg/train.py`), and a generator method (`pkg/more.py`)."""
    root = project(tmp_path / "project")
    second = GENERATOR.replace("class Trainer:", "class More:").replace("step {i}", "more {i}")
    (root / "pkg" / "more.py").write_text(second)
    (root / "drive.py").write_text(
        DRIVE.replace(
            "    train()", "    train()\n    for line in More().train():\n        print(line)"
        ).replace(
            "from pkg.train import train", "from pkg.more import More\nfrom pkg.train import train"
        )
    )
    assert shown(root) == ["step 0 w 65", "step 1 w 127", "more 0 w 65", "more 1 w 127"]
    return root, second


def readbacks(root: Path, texts: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Verify the files `texts` (path -> original, candidate) in `root`; return each file's
    readback verdict (status, reason)."""
    options = Options(unsafe_fixes=True, target_jax=(0, 8))
    requests = []
    for path, (original, candidate) in texts.items():
        sites = tuple(migrate_source(original, options=options).sites)
        requests.append(VerifyRequest(path, original, candidate, sites))
    config = VerifyConfig(root=root, timeout=120.0, jobs=1, verify_with=COMMAND)
    verdicts = verify(requests, config)
    out = {}
    for request in requests:
        readback = next(s for s in request.sites if "readback" in s.message)
        verdict = verdicts[(request.path, readback.key)]
        out[request.path] = (verdict.status.value, verdict.reason)
    return out


def test_a_wrong_rewrite_in_one_file_fails_its_own_group_not_anothers(tmp_path: Path) -> None:
    """The generator's readback is made wrong: the tree with every site rewritten prints
    something else, and each file is judged again on a run where it alone is rewritten: the
    generator's edit fails, the function's edits verify."""
    root, second = two_groups(tmp_path)
    options = Options(unsafe_fixes=True, target_jax=(0, 8))
    right = migrate_source(TRAIN, options=options).code
    wrong = migrate_source(second, options=options).code
    assert "float(w)" in wrong, wrong
    wrong = wrong.replace("float(w)", "float(w * jax.local_device_count())")
    found = readbacks(root, {"pkg/train.py": (TRAIN, right), "pkg/more.py": (second, wrong)})
    assert found["pkg/train.py"][0] == "verified", found
    assert found["pkg/more.py"][0] == "failed", found
    assert "is `more 0 w 520`" in found["pkg/more.py"][1], found
    for path, (_, reason) in found.items():
        assert f"judged on a run with {path} alone rewritten" in reason, found


def test_rewrites_right_alone_and_wrong_together_are_not_verified(tmp_path: Path) -> None:
    """Each file's rewrite prints the same alone, but the function's readback doubles its value
    once the other file's rewrite is imported: what would be written together is wrong, and
    the first run's failure stands for both."""
    root, second = two_groups(tmp_path)
    options = Options(unsafe_fixes=True, target_jax=(0, 8))
    right = migrate_source(TRAIN, options=options).code
    coupled = right.replace("float(w)", "float(w) * (2 if data.__dict__.get('MORE') else 1)")
    assert coupled != right, right
    marked = (
        migrate_source(second, options=options).code + "\nfrom pkg import data\ndata.MORE = True\n"
    )
    found = readbacks(root, {"pkg/train.py": (TRAIN, coupled), "pkg/more.py": (second, marked)})
    assert found["pkg/train.py"][0] == "failed", found
    assert found["pkg/more.py"][0] == "failed", found
    assert all("alone rewritten" not in reason for _, reason in found.values()), found
