"""When to retry a request the server refused or never answered (spec 20.4.1 rule 2, 27.1.2).

Rule 2 of 20.4.1: every rate-limit error carries ``retry_after_ms`` and the client MUST honour
it with +-30 % jitter. How this SDK honours it, and why:

* never earlier than the hint. The server's hint is the time a retry can succeed (a token
  bucket's next token promised to this refusal, ``qim.core.ratelimit``, or a measured drain
  time); a retry before it is refused again. So the jitter only spreads *later*: the delay is
  ``hint x [1, 1 + jitter]`` -- a deliberate reading of "+-30 %" (the server already spreads
  its outage hints +-30 % around the measured value);
* growing on consecutive failures of the same request: the n-th retry waits
  ``hint x factor^n`` (``reconnect_backoff``'s factor, 1.8, capped at its cap), so during an
  outage a client makes a handful of attempts per message, not one per hint (issue 15: ~7 per
  message);
* no hint (a timeout, a closed connection, or a code without one): ``reconnect_backoff``
  (B.4: 1 s x 1.8^n, cap 120 s, +-30 %);
* never: :data:`~qim.schemas.frames.errors.RETRY_AFTER_NEVER_MS` (a size refusal, such as a
  PRESENCE_SUB over ``presence_sub_max_targets``), and the codes whose A.6 action is not a
  retry (PERMISSION_DENIED, PAYLOAD_TOO_LARGE, FANOUT_QUOTA_EXCEEDED, TOKEN_REVOKED,
  UPGRADE_REQUIRED): :func:`retry_delay_ms` returns None.
"""

from __future__ import annotations

import random
from typing import Final

from qim.client.errors import QimError
from qim.params import lookup
from qim.params.values import ExponentialBackoff
from qim.schemas.frames import ClientAction
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS

__all__ = ["DEFAULT_BACKOFF", "FINAL_ACTIONS", "retry_delay_ms"]

DEFAULT_BACKOFF: Final[ExponentialBackoff] = lookup("reconnect_backoff").default

FINAL_ACTIONS: Final = frozenset(
    {
        ClientAction.DO_NOT_RETRY,
        ClientAction.REJECT_LOCALLY,
        ClientAction.SHOW_SEND_FAILURE,
        ClientAction.WIPE_AND_LOGIN,
        ClientAction.PROMPT_UPGRADE,
    }
)
"""A.6 actions a wait cannot fix: the request is refused, not pending."""


def retry_delay_ms(
    error: QimError | None,
    attempt: int = 0,
    *,
    backoff: ExponentialBackoff = DEFAULT_BACKOFF,
    rng: random.Random | None = None,
) -> int | None:
    """Milliseconds to wait before retry ``attempt`` (0 = the first retry) of a request that
    failed with ``error`` (None: timed out or the connection closed); None = do not retry."""
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    uniform = (rng or random).uniform
    hint = None if error is None else error.retry_after_ms
    if error is not None and (error.action in FINAL_ACTIONS or hint == RETRY_AFTER_NEVER_MS):
        return None
    if hint is None or hint <= 0:
        base = backoff.delay_ms(attempt)
        return max(1, round(base * uniform(1 - backoff.jitter, 1 + backoff.jitter)))
    grown = min(backoff.cap_ms, round(hint * backoff.factor**attempt))
    return max(hint, round(max(hint, grown) * uniform(1, 1 + backoff.jitter)))
