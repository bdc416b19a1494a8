"""Run a verification: plan, record, run both sides in worker pairs, and decide per site.

Files are spread over `jobs` lanes; a lane is one original worker and one candidate worker, and
its original worker runs ahead of its candidate worker, so the two overlap. When sites of a file
fail, the file is rewritten without them (`VerifyRequest.rewrite`, or the passes) and the sites
that had verified are verified again against that text, so what is written is what was verified.
"""

from __future__ import annotations

import queue
import re
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from jaxmigrate.model import Status
from jaxmigrate.verify import groups, lifetime, writes, xlacache
from jaxmigrate.verify.bound import (
    Rerun,
    fallbacks,
    judge_bound,
    parent,
    rerun,
    shadows,
    with_replay,
)
from jaxmigrate.verify.child.protocol import SCRIPT, Ran
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.judge import (
    candidate_verdict,
    layout_verdict,
    no_call,
    original_verdict,
    test_folder,
    tried,
    uncalled_verdict,
    with_jax,
)
from jaxmigrate.verify.messages import Sources, Task, make_task
from jaxmigrate.verify.notebooks import demote, verify_notebooks
from jaxmigrate.verify.planner import Plan, plan_all
from jaxmigrate.verify.pool import Reply, Worker
from jaxmigrate.verify.processes import processes_hint
from jaxmigrate.verify.recording import Recording, alone, record, record_again, supplement
from jaxmigrate.verify.targets import Kind
from jaxmigrate.verify.workspace import Workspace, workspace

MAX_ROUNDS = 3
Key = tuple[str, str]


@dataclass
class Lane:
    """A pair of workers: one for original code, one for rewritten code."""

    original: Worker
    candidate: Worker

    def stop(self) -> None:
        self.original.stop()
        self.candidate.stop()


@dataclass
class Run:
    """The state of one verification run."""

    config: VerifyConfig
    ws: Workspace
    lanes: list[Lane]
    recording: Recording
    originals: dict[str, Reply] = field(default_factory=dict)

    def original_reply(self, lane: Lane, task: Task) -> Reply:
        """Run the original (once per plan: later rounds reuse its outputs)."""
        reply = self.originals.get(task.plan.id)
        if reply is None:
            reply = lane.original.request(task.original, self.config.timeout)
            self.originals[task.plan.id] = reply
        return reply

    def candidate_reply(self, lane: Lane, task: Task) -> Reply:
        """Run the rewrite; a hang is retried once (simulated meshes can deadlock)."""
        reply = lane.candidate.request(task.candidate, self.config.timeout)
        if reply.kind == "timeout":
            reply = lane.candidate.request(task.candidate, self.config.timeout)
        return reply

    def judge(self, lane: Lane, task: Task, original: Reply) -> Verdict:
        verdict = self.decide(lane, task, original)
        versions = {"original": lane.original.jax, "candidate": lane.candidate.jax}
        return with_jax(verdict, tried(original), versions, bool(self.config.reference_python))

    def decide(self, lane: Lane, task: Task, original: Reply) -> Verdict:
        tests = test_folder(self.config.root)
        verdict = original_verdict(task.plan, original, self.config.verify_with, tests)
        if verdict is not None:
            return verdict
        ran = original.message
        assert isinstance(ran, Ran)  # original_verdict judged every other reply
        verdict = candidate_verdict(task.plan, ran, self.candidate_reply(lane, task))
        return uncalled_verdict(layout_verdict(verdict, ran), task.plan, ran)

    def run_lane(self, lane: Lane, tasks: Sequence[Task]) -> dict[str, Verdict]:
        """Run tasks on one lane, the original worker one task ahead of the candidate worker."""
        handoff: queue.Queue[tuple[Task, Reply]] = queue.Queue()

        def originals() -> None:
            for task in tasks:
                try:
                    reply = self.original_reply(lane, task)
                except Exception as exc:  # noqa: BLE001 - never leave the candidate side waiting
                    reply = Reply(
                        fault=f"could not be run: {type(exc).__name__}: {exc}", kind="crash"
                    )
                handoff.put((task, reply))

        ahead = threading.Thread(target=originals, daemon=True)
        ahead.start()
        verdicts = {}
        for _ in tasks:
            task, reply = handoff.get()
            verdicts[task.plan.id] = self.judge(lane, task, reply)
        ahead.join()
        return verdicts

    def run_tasks(self, tasks: Sequence[Task]) -> dict[str, Verdict]:
        """Run tasks over the lanes, each file on one lane (its modules load once)."""
        shares: list[list[Task]] = [[] for _ in self.lanes]
        by_file: dict[str, list[Task]] = defaultdict(list)
        for task in tasks:
            by_file[task.plan.path].append(task)
        for group in sorted(by_file.values(), key=len, reverse=True):
            min(shares, key=len).extend(group)
        with ThreadPoolExecutor(len(self.lanes)) as pool:
            futures = [pool.submit(self.run_lane, *each) for each in zip(self.lanes, shares)]
            # never asleep in the kernel until the lanes answer: a signal the kernel hands to a
            # lane thread runs its handler on this (the main) thread within lifetime.POLL s
            results = [lifetime.outcome(future) for future in futures]
        return {k: v for part in results for k, v in part.items()}


def rewrite(request: VerifyRequest, keys: frozenset[str], config: VerifyConfig) -> str:
    """Return the file with only the sites in `keys` rewritten."""
    if request.rewrite is not None:
        return request.rewrite(keys)

    from jaxmigrate.pipeline.engine import parse_module, run_passes
    from jaxmigrate.registry import all_passes

    passes = config.passes if config.passes is not None else all_passes()
    module, _ = run_passes(
        parse_module(request.original),
        request.original,
        passes,
        enabled=keys,
        path=request.path,
    )
    return module.code


@contextmanager
def lanes_for(config: VerifyConfig, ws: Workspace, count: int) -> Iterator[list[Lane]]:
    """Start `count` lanes (their JAX start-ups overlap); stop every worker afterwards."""
    lanes = [
        Lane(Worker("original", config, ws, i), Worker("candidate", config, ws, i))
        for i in range(count)
    ]
    try:
        yield lanes
    finally:
        for lane in lanes:
            lane.stop()


def sources(
    config: VerifyConfig, requests: Sequence[VerifyRequest], texts: dict[str, str]
) -> Sources:
    return Sources(config.root, {r.path: r.original for r in requests}, dict(texts))


def tasks_for(run: Run, plans: Sequence[Plan], texts: dict[str, str], src: Sources) -> list[Task]:
    return [
        make_task(
            p,
            texts[p.path],
            run.recording.calls.get(p.id),
            src,
            run.ws,
            run.config.synthesize,
            run.config.devices,
        )
        for p in plans
    ]


def next_round(
    run: Run,
    plans: Sequence[Plan],
    verdicts: dict[str, Verdict],
    enabled: dict[str, set[str]],
    texts: dict[str, str],
) -> list[Plan]:
    """Drop this round's failed sites from their files; return the plans to verify again."""
    failed = [p for p in plans if verdicts[p.id].status is Status.FAILED]
    again: list[Plan] = []
    for path, request in {p.path: p.request for p in failed}.items():
        survivors = [
            p for p in plans if p.path == path and verdicts[p.id].status is Status.VERIFIED
        ]
        if not survivors:
            continue
        enabled[path] -= {s.key for p in failed if p.path == path for s in p.sites}
        try:
            texts[path] = rewrite(request, frozenset(enabled[path]), run.config)
        except Exception as exc:  # noqa: BLE001 - keep this round's verdicts
            note = f"not re-verified without the failed sites: {type(exc).__name__}: {exc}"
            verdicts.update({p.id: unsure(verdicts[p.id], note) for p in survivors})
            continue
        run.ws.write("candidate", path, texts[path])
        again += survivors
    return again


def unsure(verdict: Verdict, note: str) -> Verdict:
    """Return a verified verdict demoted: the text that will be written was not verified."""
    return Verdict(Status.UNVERIFIED, note, {**verdict.details, "verified_with_all_sites": True})


def served_verdict(plan: Plan, command: str) -> Verdict:
    """The verdict of a function's sites that serve a program-level group made in another
    (`Plan.program_host`) before the program runs: `unverified`, as its calls, the original's,
    carry the device axis the program no longer passes it; with `--verify-with`, what the
    command prints then judges them (`verify.groups`)."""
    name, host = plan.target.qualname, plan.program_host
    reason = (
        f"`{name}` takes the values of the program-level group `{host}` makes: its calls as the "
        "original makes them carry the device axis that program no longer passes, so they "
        f"cannot judge it alone; {'what the program prints judges it' if command else 'run the program with --verify-with CMD to judge it'}"
    )
    return Verdict(Status.UNVERIFIED, reason, {"program_host": host})


def run_rounds(
    run: Run, requests: Sequence[VerifyRequest], plans: Sequence[Plan]
) -> dict[str, Verdict]:
    """Verify every plan; re-verify survivors of files that lost failed sites."""
    texts = {r.path: r.candidate for r in requests}
    enabled = {r.path: {s.key for s in r.sites} for r in requests}
    verdicts: dict[str, Verdict] = {}
    pending = list(plans)
    for number in range(1, MAX_ROUNDS + 1):
        src = sources(run.config, requests, texts)
        fresh = run.run_tasks(tasks_for(run, pending, texts, src))
        verdicts.update({k: with_round(v, number) for k, v in fresh.items()})
        pending = next_round(run, pending, verdicts, enabled, texts)
        if not pending:
            break
        for lane in run.lanes:
            lane.candidate.stop()
    return verdicts


def try_alternatives(
    run: Run, requests: Sequence[VerifyRequest], plans: Sequence[Plan], verdicts: dict[str, Verdict]
) -> None:
    """Verify the offered alternative of each site verified in the first round, in place."""
    chosen: dict[str, tuple[str, str]] = {}
    for plan in plans:
        verdict = verdicts[plan.id]
        offered = [s.key for s in plan.sites if s.key in plan.request.alternatives]
        if offered and verdict.status is Status.VERIFIED and "round" not in verdict.details:
            chosen[plan.id] = (offered[0], plan.request.alternatives[offered[0]])
    tasks = []
    for plan in plans:
        if plan.id in chosen:
            texts = {plan.path: chosen[plan.id][1]}
            tasks += tasks_for(run, [plan], texts, sources(run.config, requests, texts))
    for plan_id, outcome in run.run_tasks(tasks).items():
        alternative = {"site": chosen[plan_id][0], "status": str(outcome.status)}
        alternative["reason"] = outcome.reason
        details = {**verdicts[plan_id].details, "alternative": alternative}
        verdicts[plan_id] = replace(verdicts[plan_id], details=details)


def with_round(verdict: Verdict, number: int) -> Verdict:
    return (
        verdict if number == 1 else replace(verdict, details={**verdict.details, "round": number})
    )


def with_processes_hint(verdict: Verdict, plan: Plan, config: VerifyConfig) -> Verdict:
    """Add `--processes 2` to the reason when the code uses multi-process APIs."""
    hint = processes_hint(plan.request.original, config.processes)
    if not hint:
        return verdict
    details = {**verdict.details, "processes_hint": hint}
    return replace(verdict, reason=f"{verdict.reason}; {hint}", details=details)


def verify(requests: Sequence[VerifyRequest], config: VerifyConfig) -> dict[Key, Verdict]:
    """Verify every unsafe site of `requests`; return a verdict for every site.

    Safe sites are `not-needed`; an unsafe site is `verified`, `failed` or `unverified`. Never
    raises for what user code does; never writes under `config.root`.
    """
    plans, verdicts = plan_all(requests, config.root, record=bool(config.verify_with))
    if not plans:
        return with_deleted(requests, verdicts)
    # A notebook's sites are verified by recording its cells' calls, but a program it makes
    # in its cells by running them as one script through the layout adapters (`SCRIPT`).
    notebooks = [p for p in plans if p.request.command and p.target.qualname != SCRIPT]
    modules = [p for p in plans if not p.request.command or p.target.qualname == SCRIPT]
    bound = [p for p in modules if p.target.kind is Kind.BOUND]
    runnable = [p for p in modules if p.target.kind is not Kind.BOUND]
    originals = {r.path: r.original for r in requests}
    candidates = {path: text for r in requests for path, text in r.files.items()}
    candidates.update({r.path: r.candidate for r in requests})
    units = shadows(runnable) if config.verify_with else []
    command = config.verify_with or ""
    xlacache.prepare()  # before the snapshot of `~`: a new `~/.cache` is ours, not the code's
    with (
        writes.watched(config.root) as outside,
        lifetime.running(),
        workspace(config.root, originals, candidates) as ws,
    ):
        recording = (
            record(command, [*modules, *units], ws, config)
            if config.verify_with and modules
            else Recording()
        )
        if config.verify_with and runnable and config.project_tests:
            recording = supplement(recording, runnable, ws, config)
        again = rerun(command, [*bound, *units], candidates, ws, config) if bound else None
        count = max(1, min(config.jobs, len({p.path for p in modules})))
        with lanes_for(config, ws, count) as lanes:
            run = Run(config, ws, lanes, recording)
            served = [p for p in runnable if p.program_host]
            replayed = [p for p in runnable if not p.program_host]
            by_plan = run_rounds(run, requests, replayed) if replayed else {}
            by_plan |= {p.id: served_verdict(p, command) for p in served}
            try_alternatives(run, requests, runnable, by_plan)
            judged = [*bound, *fallbacks(units, by_plan, recording)]
            if (judged or served) and again is None and config.verify_with:
                again = rerun(command, judged, candidates, ws, config)
            if again is not None:
                found = judge_bound(judged, recording, again, lanes[0].candidate, config)
                functions = {p.id: p for p in runnable}
                edits = groups.pending(
                    [*units, *bound], [*runnable, *judged], by_plan | found, recording, functions
                )
                if edits:  # a group's other sites: what the command prints, `verify.groups`
                    second = record_again(command, [*modules, *units], ws, config)
                    found |= groups.judge(edits, command, recording, second, again)
                    if any(found[e.plan.id].status is Status.FAILED for e in edits):

                        def rerun_alone(side: str, texts: dict[str, str]) -> Rerun:
                            alone(ws, side, texts)
                            return rerun(command, [], texts, ws, config, side=side)

                        found |= groups.by_file(edits, command, recording, second, rerun_alone)
                    # a shadow joins the plans judged; a bound plan in a method is one already
                    shadowed = {p.id for p in units}
                    judged = [*judged, *(e.plan for e in edits if e.plan.id in shadowed)]
                found.update(
                    {
                        p.id: with_replay(found[p.id], by_plan[parent(p)])
                        for p in judged[len(bound) :]
                    }
                )
                paths = {p.id: p.path for p in plans}
                by_plan.update(demote_bound(judged, found, by_plan, paths))
                plans = [*plans, *judged[len(bound) :]]
            if notebooks:
                by_plan.update(
                    verify_notebooks(notebooks, candidates, ws, lanes[0].candidate, config)
                )
            demote_with_programs(notebooks, runnable, by_plan)
        isolation = lifetime.isolation()
    wrote = writes.note(outside)
    for plan in plans:
        verdict = with_processes_hint(by_plan[plan.id], plan, config)
        verdict = sandboxed(verdict, isolation)
        if wrote:
            details = {**verdict.details, "outside_writes": outside}
            verdict = replace(verdict, reason=f"{verdict.reason}; {wrote}", details=details)
        if recording.note and not plan.request.command:
            verdict = replace(verdict, details={**verdict.details, "verify_with": recording.note})
        if recording.error and not plan.request.command:
            error = {"verify_with_error": recording.error}
            verdict = replace(verdict, details={**verdict.details, **error})
        if plan.id in recording.supplied:
            verdict = supplied(verdict, plan, recording.supplied[plan.id], command)
        verdict = missed(verdict, plan, recording, command)
        for site in plan.sites:
            key = (plan.path, site.key)
            verdicts[key] = combined(verdicts[key], verdict) if key in verdicts else verdict
    return with_deleted(requests, verdicts)


def with_deleted(
    requests: Sequence[VerifyRequest], verdicts: dict[Key, Verdict]
) -> dict[Key, Verdict]:
    """Give each site deleting code its program-level group leaves unread (`deleted` in its
    details: flax imagenet's `sync_batch_stats`, whose calls the group deletes) its group's
    verdict: nothing in the rewrite runs that code, so the group's runs, where its calls were,
    judge it. Verified when every other site of the group is, failed when one failed."""
    for request in requests:
        for site in request.sites:
            if not site.details.get("deleted") or site.group is None:
                continue
            others = [
                verdicts[(request.path, s.key)]
                for s in request.sites
                if s.group == site.group
                and not s.details.get("deleted")
                and (request.path, s.key) in verdicts
            ]
            statuses = {v.status for v in others}
            name = f"`{site.details['deleted']}`"
            if others and statuses <= {Status.VERIFIED, Status.NOT_NEEDED}:
                reason = (
                    f"{name} runs in no rewrite: its group's {len(others)} other site(s), "
                    "where its calls were, verified"
                )
                verdict = Verdict(Status.VERIFIED, reason, {"deleted_with": site.group})
            elif Status.FAILED in statuses:
                reason = f"{name} runs in no rewrite, and its group failed verification"
                verdict = Verdict(Status.FAILED, reason, {"deleted_with": site.group})
            else:
                reason = f"{name} runs in no rewrite: judged with its group, not verified"
                verdict = Verdict(Status.UNVERIFIED, reason, {"deleted_with": site.group})
            verdicts[(request.path, site.key)] = verdict
    return verdicts


# How a blocked network attempt ends, in the messages of Python, urllib, requests and httpx.
NETWORK_FAILURES = re.compile(
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|nodename nor servname|No address associated with hostname|getaddrinfo failed"
)
BLOCKED = "the code tried to reach the network, which verification blocks"


def demote_with_programs(
    notebooks: Sequence[Plan], runnable: Sequence[Plan], by_plan: dict[str, Verdict]
) -> None:
    """Demote, in place, the verified sites of a notebook whose cells make a program-level
    group (run as a script, `SCRIPT`) when one of its sites failed (`notebooks.demote`)."""
    programs = [p for p in runnable if p.request.command]
    for path in {p.path for p in programs}:
        demote([p for p in [*notebooks, *programs] if p.path == path], by_plan)


def sandboxed(verdict: Verdict, isolation: str) -> Verdict:
    """Return a verdict that says how the network sandbox bore on it.

    In the sandbox, a run that failed on a network error tried to reach the network: the site is
    `unverified` with that reason. Without the sandbox the details say the run was not isolated.
    """
    if isolation:
        return replace(verdict, details={**verdict.details, "network": isolation})
    found = NETWORK_FAILURES.search(
        verdict.reason + " " + str(verdict.details.get("notebook_error", ""))
    )
    if found is None or verdict.status is Status.VERIFIED:
        return verdict
    details = {**verdict.details, "network": BLOCKED, "blocked": verdict.reason}
    return Verdict(Status.UNVERIFIED, f"{BLOCKED} ({found.group(0)}): {verdict.reason}", details)


def combined(first: Verdict, second: Verdict) -> Verdict:
    """Return the verdict of a site verified by two plans (its callable, and the unit using it):
    failed if either failed, verified if either verified, else unverified with both reasons."""
    order = (Status.FAILED, Status.VERIFIED)
    for status in order:
        if status in (first.status, second.status):
            return first if first.status is status else second
    return Verdict(first.status, f"{first.reason}; {second.reason}", first.details)


def missed(verdict: Verdict, plan: Plan, recording: Recording, command: str) -> Verdict:
    """Return an unverified verdict saying why the command's calls of its function were not
    recorded, when they all took another path than its sites ("never ran the site's line
    595": flax lm1b's checkpoint readback, with checkpoints off)."""
    why = recording.missed.get(plan.id)
    ran = plan.id in recording.calls or plan.id in recording.ran
    if not why or verdict.status is not Status.UNVERIFIED or ran:
        return verdict
    name = plan.target.qualname
    note = (
        f"`{command}` called `{name}`, but its call(s) {why} (they took another path through "
        "it), so none was recorded"
    )
    details = {**verdict.details, "missed": why}
    said = no_call(command)  # it did call it: say what the call did instead
    if said in verdict.reason:
        return replace(verdict, reason=verdict.reason.replace(said, note, 1), details=details)
    return replace(verdict, reason=f"{verdict.reason}; {note}", details=details)


def supplied(verdict: Verdict, plan: Plan, tests: str, command: str) -> Verdict:
    """Return a verdict whose inputs came from the project's tests, saying so."""
    where = (
        f"inputs recorded by the project's tests that call `{plan.target.qualname}`, "
        f"{tests}: {no_call(command)}"
    )
    details = {**verdict.details, "recorded_by": tests}
    return replace(verdict, reason=f"{verdict.reason} ({where})", details=details)


def demote_bound(
    bound: Sequence[Plan],
    found: dict[str, Verdict],
    others: dict[str, Verdict],
    paths: dict[str, str],
) -> dict[str, Verdict]:
    """Return bound verdicts, a verified one demoted when its file loses a failed site.

    The command ran on the file with every site rewritten; without the failed one the text
    that will be written was not run.
    """
    lost = {p.path for p in bound if found[p.id].status is Status.FAILED}
    lost |= {paths[pid] for pid, v in others.items() if v.status is Status.FAILED}
    note = "not re-verified without the failed sites of its file"
    return {
        p.id: unsure(found[p.id], note)
        if p.path in lost and found[p.id].status is Status.VERIFIED
        else found[p.id]
        for p in bound
    }
