"""How writes are retried: which API errors are worth another try, and how long each waits.

A 429's Retry-After is obeyed (capped); other transient errors back off exponentially with
jitter. Copy writes retry in a loop of their own (`writer.Writer`, once per write: tenacity's
per-call work cost too much there); status writes, once per reconcile at most, take the
tenacity policy `status_retrying`.
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
    wait_exponential_jitter,
)

from projector.errors import ApiError, Conflict, TooManyRequests

log = structlog.get_logger("projector.writer")  # the status writes' retries: the writer's log


MAX_RETRY_AFTER = 10.0
"""Cap on a 429's Retry-After: a server asking for minutes must not stall a worker that long."""


def retry_after(error: ApiError) -> float:
    """How long the server asked us to wait (a 429's Retry-After, capped); 0 if it did not."""
    if isinstance(error, TooManyRequests):
        return min(float(error.retry_after), MAX_RETRY_AFTER)
    return 0.0


def retry_delay(error: ApiError, attempt: int, initial: float, maximum: float) -> float:
    """Before retry `attempt` (1, 2, ...): a 429's Retry-After (capped), else backoff + jitter."""
    if isinstance(error, TooManyRequests):
        return retry_after(error)
    return min(initial * 2.0 ** (attempt - 1), maximum) + random.uniform(0, initial)


def transient(e: ApiError) -> bool:
    """A copy write worth trying again: transient, but never a 409 (the plan is stale)."""
    return e.transient and not isinstance(e, Conflict)


def _retryable_status_error(e: BaseException) -> bool:
    """A status write worth trying again: transient API errors (5xx, no response, 429, 409).

    A fence (`Fenced`) or a bug is not an `ApiError` and is never retried.
    """
    return isinstance(e, ApiError) and e.transient


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
    exponential = wait_exponential_jitter(multiplier=first, max=cap, jitter=first)

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, TooManyRequests):
            return retry_after(error)
        return float(exponential(state))

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
        retry=retry_if_exception(_retryable_status_error),
        before_sleep=logged,
        reraise=True,
    )
