"""The error tree of projector, so callers branch on meaning, not on HTTP library types.

    ProjectorError
    ├── InvalidGrant              a grant that cannot be acted on as written (terminal)
    ├── Fenced                    a write refused because this replica holds no valid lease
    └── ApiError(status, reason)  the API server answered with an error status
        ├── AuthenticationFailed  401 and no fresh credentials to be had (re-authentication failed)
        ├── NotFound              404
        ├── Conflict              409 (stale resourceVersion, or AlreadyExists)
        ├── Forbidden             403
        ├── Gone                  410 (a watch's resourceVersion is too old: relist)
        ├── Invalid               422
        ├── TooManyRequests       429 (carries retry_after)
        └── ServerError           5xx, and transport failures (status 0)

Messages never carry Secret values: they are built from status codes, reasons and the
server's message, which Kubernetes writes without Secret data.
"""

from __future__ import annotations


class ProjectorError(Exception):
    """Base of every error projector raises on purpose."""


class InvalidGrant(ProjectorError):
    """A grant that cannot be acted on as written; retrying will not help."""

    def __init__(self, grant: str, why: str) -> None:
        super().__init__(f"grant {grant}: {why}")
        self.grant = grant
        self.why = why


class Fenced(ProjectorError):
    """A write refused before it was sent: this replica holds no valid lease right now."""


class ApiError(ProjectorError):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(
        self, status: int, reason: str = "", message: str = "", causes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes
        """The `reason` of each of the Status' details.causes (e.g. NamespaceTerminating)."""

    @property
    def transient(self) -> bool:
        """Tell whether it is the server's trouble, so the same request may succeed later.

        No answer, a 429 or a 5xx. A 409 is not: it is about the request (a stale
        resourceVersion, a precondition), which only a fresh plan mends.
        """
        return self.status in (0, 429) or self.status >= 500


class AuthenticationFailed(ApiError):
    """401, and asking for fresh credentials failed (or is backing off after failing).

    Not transient: retrying the request at once cannot help; the caller backs off (the queue's
    per-grant backoff, the informer's policy) and the client tries to re-authenticate again
    only after its own backoff.
    """

    def __init__(self, message: str) -> None:
        super().__init__(401, "ReauthenticationFailed", message)


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409: a stale resourceVersion, or AlreadyExists on create."""

    @property
    def already_exists(self) -> bool:
        """Tell a create that hit an existing object from an update that was stale."""
        return self.reason == "AlreadyExists"


class Forbidden(ApiError):
    """403: RBAC or admission said no (a terminating namespace gives this on create)."""

    @property
    def namespace_terminating(self) -> bool:
        """Tell a create refused because its namespace is being deleted (the API's own cause)."""
        return "NamespaceTerminating" in self.causes


class Gone(ApiError):
    """410: the watch's resourceVersion has been compacted away; the informer must relist."""


class Invalid(ApiError):
    """422: the object was rejected by validation."""


class TooManyRequests(ApiError):
    """429: the server asks us to slow down, for `retry_after` seconds."""

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        causes: tuple[str, ...] = (),
        retry_after: float = 1.0,
    ):
        super().__init__(status, reason, message, causes)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx, or a transport failure (status 0): the server is unwell or unreachable."""


_BY_STATUS: dict[int, type[ApiError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


def api_error(
    status: int,
    reason: str = "",
    message: str = "",
    causes: tuple[str, ...] = (),
    retry_after: float = 1.0,
) -> ApiError:
    """Build the most specific ApiError for an HTTP status."""
    if status == 429:
        return TooManyRequests(status, reason, message, causes, retry_after)
    if status == 0 or status >= 500:
        return ServerError(status, reason, message, causes)
    return _BY_STATUS.get(status, ApiError)(status, reason, message, causes)
