"""The one retry rule: which API errors are worth another try, and how long each waits.

A 429's Retry-After is obeyed (capped); anything else backs off exponentially with jitter
(`backoff`). Every retrier takes its waits from here: copy writes (a loop of their own in
`writer.Writer`, once per write: tenacity's per-call work cost too much there), status writes
(the tenacity policy `status_retrying`), the hash key, the informers, the elector's campaign,
the client's re-authentication, and the work queue's per-key backoff (without jitter: its
clock is injected and its tests exact).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)

from projector.errors import ApiError, Conflict, TooManyRequests

log = structlog.get_logger("projector.writer")  # the status writes' retries: the writer's log


MAX_RETRY_AFTER = 10.0
"""Cap on a 429's Retry-After: a server asking for minutes must not stall a worker that long."""


_MAX_EXPONENT = 64
"""2.0**64 times any sane first wait exceeds any sane cap; avoids an overflow."""


def backoff(attempt: int, initial: float, maximum: float, jitter: float | None = None) -> float:
    """The one backoff: the wait after failed try `attempt` (1, 2, ...).

    `initial` doubling per attempt, plus up to `jitter` (default: `initial`) at random, never
    above `maximum`.
    """
    grown = initial * 2.0 ** min(attempt - 1, _MAX_EXPONENT)
    spread = initial if jitter is None else jitter
    return min(maximum, grown + (random.uniform(0, spread) if spread > 0 else 0.0))


def retry_after(error: BaseException | None, cap: float = MAX_RETRY_AFTER) -> float:
    """How long the server asked us to wait (a 429's Retry-After, capped); 0 if it did not."""
    if isinstance(error, TooManyRequests):
        return min(float(error.retry_after), cap)
    return 0.0


def retry_delay(
    error: BaseException | None,
    attempt: int,
    initial: float,
    maximum: float,
    *,
    jitter: float | None = None,
    retry_after_cap: float = MAX_RETRY_AFTER,
) -> float:
    """Before retry `attempt` (1, 2, ...): a 429's Retry-After (capped), else `backoff`."""
    if isinstance(error, TooManyRequests):
        return retry_after(error, retry_after_cap)
    return backoff(attempt, initial, maximum, jitter)


def status_retryable(e: BaseException) -> bool:
    """A status write worth trying again: a transient API error, or a 409.

    A merge patch carries no precondition, so a 409 from one is the server's own race, not a
    stale plan (copy writes, which do carry one, never retry a 409). A fence (`Fenced`) or a
    bug is not an `ApiError` and is never retried.
    """
    return isinstance(e, ApiError) and (e.transient or isinstance(e, Conflict))


@dataclass(frozen=True)
class Retries:
    """How many tries a write gets in all, and the backoff between them: (first wait, cap)."""

    attempts: int
    backoff: tuple[float, float]


COPY_RETRIES = Retries(4, (0.05, 2.0))
STATUS_RETRIES = Retries(5, (0.2, 5.0))


def status_retrying(retries: Retries) -> AsyncRetrying:
    """The retry policy of a grant's status write.

    Up to `attempts` tries, exponential backoff from `backoff[0]` to `backoff[1]` with jitter
    (a 429 waits its Retry-After, capped, instead), only for transient API errors, each retry
    logged with its attempt number. The last error is re-raised to the caller.
    """
    attempts, (first, cap) = retries.attempts, retries.backoff

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return retry_delay(error, state.attempt_number, first, cap)

    def logged(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "status write failed; retrying",
            attempt=f"{state.attempt_number}/{attempts}",
            status=getattr(error, "status", None),
            reason=getattr(error, "reason", type(error).__name__),
            retry_in=round(state.upcoming_sleep, 3),
        )

    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait,
        retry=retry_if_exception(status_retryable),
        before_sleep=logged,
        reraise=True,
    )
