"""Verification: run the original and the rewritten code on a simulated CPU mesh and compare.

    from jaxmigrate.verify import VerifyConfig, VerifyRequest, Verdict, verify
    verdicts = verify([VerifyRequest(path, original, candidate, sites)], VerifyConfig(root))
    verdicts[(path, site.key)].status   # VERIFIED / FAILED / UNVERIFIED / NOT_NEEDED

`verify_results(results, options, config)` does the same for the engine's FileResults and
re-decides them (what `jaxmigrate run` needs); `verify_against(rev, paths, config)` verifies the
definitions changed by hand since a git revision.

JAX is only ever imported by the worker subprocesses (`child/`), never in this process.
"""

from __future__ import annotations

from jaxmigrate.verify.against import verify_against
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.results import annotate, verify_results
from jaxmigrate.verify.session import verify

__all__ = [
    "Verdict",
    "VerifyConfig",
    "VerifyRequest",
    "annotate",
    "verify",
    "verify_against",
    "verify_results",
]
