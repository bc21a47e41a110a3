"""Who may read /metrics: a bearer token the API server vouches for, allowed to `get` /metrics.

What controller-runtime's secure metrics and kube-rbac-proxy do, asked of the API server with
the controller's own credentials: a TokenReview says whose token it is, then a
SubjectAccessReview says whether that user may `get` the non-resource URL `/metrics` (the
chart's ClusterRole `<release>-metrics-reader` allows it; bind a scraper's ServiceAccount to it).

    200  allowed
    401  no bearer token, or one the API server does not authenticate
    403  authenticated, not allowed
    429  too many other tokens are being reviewed right now (Retry-After: 1)
    503  the API server did not answer the review (nothing remembered; the next scrape asks
         again), unless the token was allowed within `grace` (15 min): it still is

Anyone who reaches the port can send tokens, so what they cost is bounded. A verdict (200, 401
or 403) is remembered for `ttl` seconds (60) under the token's SHA-256, never the token itself,
at most `size` (1,024) of them, the least recently used forgotten first: a scraper costs two
reviews a minute however often it scrapes, and a revoked binding is honoured within a minute.
Requests with the same token wait for one review; at most `pending` (8) tokens are reviewed at
once, and a further new token is answered 429 at once, without a review; the reviews go over a
client session of their own with its own rate limit (`projector.app`), so a flood of tokens
never takes the write budget of the controller. No token is logged, kept or put in an error.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from projector.client.api import Api
from projector.core.kinds import SUBJECTACCESSREVIEWS, TOKENREVIEWS, Obj
from projector.errors import ApiError, ProjectorError

log = structlog.get_logger("projector.access")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to one request: its HTTP status, and whose token it was ("" if unknown)."""

    status: int
    user: str = ""

    @property
    def allowed(self) -> bool:
        """The request is served."""
        return self.status == 200


NO_TOKEN = Verdict(401)
BUSY = Verdict(429)
UNAVAILABLE = Verdict(503)


def bearer(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header; "" for none or another scheme."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class Access:
    """Reviews the bearer tokens of requests for one path, remembering verdicts briefly."""

    def __init__(
        self,
        api: Api,
        *,
        path: str = "/metrics",
        ttl: float = 60.0,
        size: int = 1024,
        pending: int = 8,
        grace: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._path = path
        self._ttl = ttl
        self._size = size
        self._max_pending = pending
        self._grace = grace
        self._clock = clock
        self._verdicts: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()
        """By the token's SHA-256: (monotonic expiry, verdict), least recently used first."""
        self._pending: dict[bytes, asyncio.Task[Verdict]] = {}
        """Reviews under way, by the token's SHA-256: a later request with it awaits the same."""

    async def check(self, authorization: str | None) -> Verdict:
        """The verdict on a request's `Authorization` header (see the module's table)."""
        token = bearer(authorization)
        if not token:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).digest()
        remembered = self._verdicts.get(key)
        if remembered is not None:
            expires, verdict = remembered
            self._verdicts.move_to_end(key)
            if self._clock() < expires:
                return verdict
        task = self._pending.get(key)
        if task is None:
            if len(self._pending) >= self._max_pending:
                return BUSY
            # A task of its own: a request that goes away does not cancel the others' review.
            task = asyncio.create_task(self._review(key, token), name="metrics-token-review")
            self._pending[key] = task
        return await asyncio.shield(task)

    async def _review(self, key: bytes, token: str) -> Verdict:
        try:
            verdict = await self._ask(token)
        except ProjectorError as e:  # the message is the server's: only its status is logged
            status, reason = (e.status, e.reason) if isinstance(e, ApiError) else (0, "")
            log.warning(
                "metrics token review failed",
                error=type(e).__name__,
                status=status,
                reason=reason,
                path=self._path,
            )
            return self._stale(key)
        finally:
            del self._pending[key]
        self._verdicts[key] = (self._clock() + self._ttl, verdict)
        while len(self._verdicts) > self._size:
            self._verdicts.popitem(last=False)
        if not verdict.allowed:
            log.debug("metrics request refused", status=verdict.status, user=verdict.user)
        return verdict

    def _stale(self, key: bytes) -> Verdict:
        """While the API server cannot review, a token allowed within `grace` stays allowed.

        A control-plane outage is when an operator most needs the metrics: the scraper that was
        allowed a minute ago keeps its access until the server answers again (at most `grace`
        after its verdict expired); any other token gets 503.
        """
        remembered = self._verdicts.get(key)
        if remembered is not None:
            expires, verdict = remembered
            if verdict.allowed and self._clock() < expires + self._grace:
                return verdict
        return UNAVAILABLE

    async def _ask(self, token: str) -> Verdict:
        """A TokenReview, then (if it authenticates) a SubjectAccessReview of its user."""
        review = await self._api.review(TOKENREVIEWS, {"token": token})
        if not review.get("authenticated"):
            return NO_TOKEN
        user: Obj = review.get("user") or {}
        name = str(user.get("username") or "")
        spec: Obj = {
            "user": name,
            "groups": list(user.get("groups") or ()),
            "nonResourceAttributes": {"path": self._path, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await self._api.review(SUBJECTACCESSREVIEWS, spec)
        allowed = bool(access.get("allowed")) and not access.get("denied")
        return Verdict(200 if allowed else 403, name)
