"""Verification: run the original and the rewritten code on a simulated CPU mesh and compare.

    from jaxmigrate.verify import VerifyConfig, VerifyRequest, Verdict, verify
    verdicts = verify([VerifyRequest(path, original, candidate, sites)], VerifyConfig(root))
    verdicts[(path, site.key)].status   # VERIFIED / FAILED / UNVERIFIED / NOT_NEEDED

JAX is only ever imported by the worker subprocesses (`child/`), never in this process.
"""

from __future__ import annotations

from jaxmigrate.verify.against import verify_against
from jaxmigrate.verify.config import Verdict, VerifyConfig, VerifyRequest
from jaxmigrate.verify.session import verify

__all__ = ["Verdict", "VerifyConfig", "VerifyRequest", "verify", "verify_against"]
