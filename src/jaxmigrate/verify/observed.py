"""Judge what values cannot show: compile counts, sharding constraints, output shardings.

Each worker reports, for the calls it ran, what JAX compiled and how the outputs are sharded
(`child/observe.py`). Once the values agree, the rewrite still fails when

- it compiles the same code again where the original did not (a `jax.jit` built on every call:
  "the rewrite compiles `jit_on_devices` 5 times on the same code"), for every rule;
- for rules that keep the jitted function's code and change only its context (`with mesh:` to
  `jax.set_mesh`, `pjit` to `jax.jit`), a function compiled on both sides lowers with other
  sharding constraints or collectives, or an output array is sharded otherwise. A pmap rewritten
  to `shard_map` changes both legitimately: only its compile count is compared.

One change of an output's sharding is the migration's intended effect, not a lost sharding: a
`jax.jit` output no sharding was asked for is on one device under `with mesh:` and replicated
over the whole mesh (`P()`) under `jax.set_mesh` (JAX's own guide recommends that migration).
It is noted in the details (`placement`), not failed; an output sharded over the mesh in the
original (`out_shardings=`, a sharding constraint) must keep its spec.
"""

from __future__ import annotations

from typing import Any

from jaxmigrate.model import Status
from jaxmigrate.verify.child.protocol import Observed
from jaxmigrate.verify.config import Verdict
from jaxmigrate.verify.planner import HAND_MIGRATION, Plan

# The rules whose rewrite leaves the jitted code as it was: its lowering and its outputs'
# shardings must not change.
SAME_CODE = frozenset({"with-mesh", "pjit"})


def compares_lowering(plan: Plan) -> bool:
    """Return True if every site of the plan keeps the jitted code (lowering compared)."""
    names = {s.name for s in plan.sites}
    return bool(names) and names <= SAME_CODE and HAND_MIGRATION not in names


def observed_verdict(
    plan: Plan, before: Observed | None, after: Observed | None, details: dict[str, Any]
) -> Verdict | None:
    """Return the failed verdict when the rewrite compiles more, or (for rules that keep the
    code) lowers or shards otherwise, given what each side's worker `observed` (the `observed`
    of its reply, `child/observe.py`); else None. Adds the compile counts to `details`."""
    if before is None or after is None:
        return None
    details["compiles"] = {"original": before.compiles, "rewrite": after.compiles}
    reason = more_compiles(before, after)
    if reason is None and compares_lowering(plan):
        reason = lowering_changed(before, after) or sharding_changed(before, after, details)
    if reason is None:
        return None
    details["observed"] = reason
    return Verdict(Status.FAILED, reason, details)


def more_compiles(before: Observed, after: Observed) -> str | None:
    """Return why the rewrite compiles more often: it compiles identical code again."""
    extra = sum(after.repeated.values()) - sum(before.repeated.values())
    if extra <= 0:
        return None
    name, times = max(after.repeated.items(), key=lambda kv: kv[1])
    repeats = sum(before.repeated.values())
    original = f"repeated {repeats} compile(s)" if repeats else "compiled nothing twice"
    return (
        f"the rewrite compiles `{name}` {times + 1} times on the same code where the original "
        f"{original} (a new `jax.jit` on every call?)"
    )


def lowering_changed(before: Observed, after: Observed) -> str | None:
    """Return the first sharding constraint or collective a function compiled on both sides
    lost or gained in the rewrite."""
    old, new = before.lowering, after.lowering
    for name in sorted(set(old) & set(new)):
        pairs = (
            ("sharding constraint", old[name].constraints, new[name].constraints),
            ("collective", old[name].collectives, new[name].collectives),
        )
        for what, was, now in pairs:
            lost = sorted(set(was) - set(now))
            if lost:
                return f"the rewrite's `{name}` lowers without the {what} `{lost[0]}` of the original's"
            gained = sorted(set(now) - set(was))
            if gained:
                return f"the rewrite's `{name}` lowers with a {what} `{gained[0]}` the original's has not"
    return None


ONE_DEVICE = "one device (unsharded)"


def replicated(text: str) -> bool:
    """Return True if `text` (`child/observe.sharding_text`) is fully replicated over a mesh."""
    return text.startswith("P() over mesh (")


def sharding_changed(before: Observed, after: Observed, details: dict[str, Any]) -> str | None:
    """Return the first output array sharded otherwise in the rewrite.

    An output on one device in the original and replicated over the mesh in the rewrite is
    what `jax.set_mesh` does with a jit output no sharding was asked for: it is noted in
    `details["placement"]`, not returned.
    """
    old, new = before.shardings, after.shardings
    placed: list[str] = []
    for where in old:
        if where not in new or old[where] == new[where]:
            continue
        if old[where] == ONE_DEVICE and replicated(new[where]):
            placed.append(where)
            continue
        return (
            f"the sharding of {where} changed: {old[where]} in the original, "
            f"{new[where]} in the rewrite"
        )
    if placed:
        shown = ", ".join(placed[:3]) + (f" and {len(placed) - 3} more" if len(placed) > 3 else "")
        details["placement"] = (
            f"{len(placed)} output array(s) ({shown}) on one device in the original are "
            f"replicated over the mesh in the rewrite ({new[placed[0]]}): `jax.set_mesh` places "
            "a jit output no sharding was asked for on the whole mesh, with the same values"
        )
    return None
