"""What a lowering verifies, read from the caller's flags once, where they enter (``lower``, ``edgeplug.verify``).

``verify_options(verify, verify_steps, tolerance)`` checks the flags together and says what verification
will run: ``None`` (none), or the ``VerifyOptions`` every later step reads instead of the flags. A flag
that cannot work is refused here, before any work, with ``EdgeplugError`` naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from edgeplug._errors import EdgeplugError
from edgeplug._verify.compare import check_tolerance


@dataclass(frozen=True)
class VerifyOptions:
    """Verification asked for: the tolerance (None: by output dtype) and the greedy tokens (None: no greedy check)."""

    tolerance: Optional[float] = None
    steps: Optional[int] = None


def check_verify_steps(steps: Any) -> Optional[int]:
    """``steps`` if it is None or a whole number >= 1; raises ``EdgeplugError`` otherwise."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise EdgeplugError(f"verify_steps must be a whole number >= 1 (tokens to generate), not {steps!r}; nothing was done")
    return steps


def verify_options(verify: bool, verify_steps: Any = None, tolerance: Any = None) -> Optional[VerifyOptions]:
    """The flags of ``lower`` as one decision: None when nothing is verified, else what to verify."""
    steps = check_verify_steps(verify_steps)
    tol = check_tolerance(tolerance)
    if steps is not None and not verify:
        raise EdgeplugError(
            f"verify_steps={steps!r} is a mode of verification: pass verify=True as well (--verify); nothing was done"
        )
    return VerifyOptions(tolerance=tol, steps=steps) if verify else None


__all__ = ["VerifyOptions", "check_verify_steps", "verify_options"]
