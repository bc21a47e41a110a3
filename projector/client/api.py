"""The API server as projector's code sees it: requests, preconditions, and `Api`.

`Api` shapes every call projector makes into a `Request` (path, query, body, media types)
and leaves only carrying it to a subclass: `kube.Kube` over HTTP, and in the unit tests a small
in-memory double, so the store, the writer and the controller are tested against the very
requests they send to the real API server. Nothing here does I/O.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from projector.core.kinds import Obj, Resource
from projector.core.names import FIELD_MANAGER
from projector.errors import ServerError


class Precondition(NamedTuple):
    """What a DELETE must still find: the uid and resourceVersion decided about ("": any).

    The API server checks it (`options`, the DeleteOptions sent); an in-memory double checks
    the same rule with `holds`.
    """

    uid: str = ""
    resource_version: str = ""

    def options(self) -> Obj:
        """The DeleteOptions body that has the API server check it (409 Conflict if not)."""
        pre = {"uid": self.uid, "resourceVersion": self.resource_version}
        return {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {k: v for k, v in pre.items() if v},
        }

    def holds(self, meta: Mapping[str, Any]) -> bool:
        """Whether an object's metadata is still the one decided about."""
        return all(
            not want or want == meta.get(field)
            for want, field in ((self.uid, "uid"), (self.resource_version, "resourceVersion"))
        )


ANY = Precondition()
"""No precondition: whatever object has the name is deleted."""


JSON = "application/json"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_METHODS = {
    "LIST": "GET",
    "WATCH": "GET",
    "GET": "GET",
    "CREATE": "POST",
    "UPDATE": "PUT",
    "DELETE": "DELETE",
    "PATCH": "PATCH",
}


@dataclass(frozen=True, slots=True)
class Request:
    """One call to the API server, shaped: what `Api`'s methods hand to the transport.

    `verb` names the call in metrics (LIST, WATCH, GET, CREATE, UPDATE, DELETE, PATCH); the
    query is in the order it is sent; a body is an object, or its JSON already encoded.
    """

    verb: str
    res: Resource
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    query: tuple[tuple[str, str], ...] = ()
    body: Obj | bytes | None = None
    content_type: str = JSON
    accept: str = JSON

    @property
    def method(self) -> str:
        """The HTTP method of the verb."""
        return _METHODS[self.verb]


def incomplete(what: str) -> ServerError:
    """The error for a 200 whose object came back without its metadata."""
    return ServerError(0, "IncompleteResponse", f"{what} came back without its metadata")


def whole(obj: Obj, res: Resource) -> Obj:
    """An object read back, checked to say what it is.

    A 200 with an empty or partial body is an error (retried, never acted on), not evidence
    that the object lacks labels or data: the seed's outage began with such a "success".
    """
    meta = obj.get("metadata") or {}
    if not meta.get("name") or not meta.get("uid"):
        raise incomplete(f"a {res.kind}")
    return obj


class Api(ABC):
    """The calls projector makes; each raises `projector.errors.ApiError` subclasses only.

    Each call is shaped here, once, into a `Request`; a subclass only carries it: `send` for
    a call with one answer, `stream` for a watch's events. `kube.Kube` carries it over HTTP,
    the unit tests' double in memory, so both see exactly the requests the controller makes.
    """

    @abstractmethod
    async def send(self, req: Request) -> Obj:
        """Make one request; its decoded answer ({} for none)."""

    @abstractmethod
    def stream(self, req: Request, read_deadline: float) -> AsyncGenerator[tuple[str, Obj], None]:
        """Make a watch request: ("OPEN", {}) once accepted, then (type, object) per line.

        A connection silent for `read_deadline` seconds raises instead of hanging.
        """

    async def pages(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        metadata_only: bool = False,
        limit: int = 500,
    ) -> AsyncGenerator[tuple[list[Obj], str], None]:
        """Yield a list one page at a time: (the page's items, the list's resourceVersion).

        One request per page (`limit`, then `continue`), and nothing of a page is kept once
        the next one is asked for, so a list costs one page of memory, not the whole list.
        A continue token that expired mid-list raises `Gone`: the caller starts over, since
        what it saw of a list it could not finish is no evidence of what is gone.
        """
        query: tuple[tuple[str, str], ...] = (("limit", str(limit)),)
        if label_selector:
            query += (("labelSelector", label_selector),)
        accept = METADATA_LIST if metadata_only else JSON
        more: tuple[tuple[str, str], ...] = ()
        while True:
            out = await self.send(
                Request("LIST", res, namespace, query=query + more, accept=accept)
            )
            meta = out.get("metadata") or {}
            if not str(out.get("kind", "")).endswith("List") or not meta.get("resourceVersion"):
                raise incomplete(f"a {res.kind} list")  # never "nothing is there"
            page: list[Obj] = out.get("items") or []  # an empty list may say `"items": null`
            del out
            yield page, str(meta["resourceVersion"])
            del page  # the caller is done with it: not alive while the next page arrives
            if not meta.get("continue"):
                return
            more = (("continue", str(meta["continue"])),)

    async def list(self, res: Resource, **pages: Any) -> tuple[list[Obj], str]:
        """Every object at once, and the list's resourceVersion (`pages`' keyword arguments).

        For tools, benchmarks and assertions: the controller reads lists with `pages`.
        """
        return await collect(self.pages(res, **pages))

    def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        read_deadline: float = 60.0,
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """Yield (type, object) from one watch request, BOOKMARKs included, until it ends.

        The first item is ("OPEN", {}) once the server has accepted the watch.

        The server ends the watch after `timeoutSeconds`; a connection that goes silent for
        `read_deadline` seconds (bookmarks arrive about every minute) raises instead of hanging,
        so a stalled watch is always detected. A 410 raises `Gone`: the caller must relist.
        """
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        return self.stream(Request("WATCH", res, query=tuple(query)), read_deadline)

    async def get(
        self, res: Resource, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> Obj:
        """Read one object; metadata-only never transfers a Secret's data."""
        accept = METADATA_ONLY if metadata_only else JSON
        return whole(await self.send(Request("GET", res, namespace, name, accept=accept)), res)

    async def create(
        self,
        res: Resource,
        body: Obj | bytes,
        *,
        namespace: str | None = None,
        metadata_only: bool = False,
    ) -> Obj:
        """POST a new object, a dict or its JSON already encoded (409 if the name is taken).

        `metadata_only` asks the server to answer with the object's metadata alone: a copy
        written is not sent back to us whole (1 MiB per copy of a 1 MiB Secret).
        """
        accept = METADATA_ONLY if metadata_only else JSON
        query = (("fieldManager", FIELD_MANAGER),)
        req = Request("CREATE", res, namespace, query=query, body=body, accept=accept)
        return await self.send(req)

    async def review(self, res: Resource, spec: Obj) -> Obj:
        """POST a review (a TokenReview, a SubjectAccessReview) and return the server's status.

        Nothing is stored: the answer is the review with its status filled in (false fields
        left out). An answer that is not a review is an error, never a denial to remember.
        """
        body = {"apiVersion": res.version, "kind": res.kind, "spec": spec}
        out = await self.send(Request("CREATE", res, body=body))
        if out.get("kind") != res.kind:
            raise ServerError(0, "IncompleteResponse", f"the answer to a {res.kind} is not one")
        status: Obj = out.get("status") or {}
        return status

    async def replace(
        self,
        res: Resource,
        body: Obj | bytes,
        *,
        namespace: str | None = None,
        name: str | None = None,
        metadata_only: bool = False,
    ) -> Obj:
        """PUT the whole object; its metadata.resourceVersion makes a stale write fail with 409.

        `name` is needed only when `body` is already encoded.
        """
        if name is None:
            assert isinstance(body, dict), "an encoded body needs its name"
            name = str(body["metadata"]["name"])
        accept = METADATA_ONLY if metadata_only else JSON
        query = (("fieldManager", FIELD_MANAGER),)
        req = Request("UPDATE", res, namespace, name, query=query, body=body, accept=accept)
        return await self.send(req)

    async def delete(
        self, res: Resource, name: str, *, namespace: str | None = None, only_if: Precondition = ANY
    ) -> None:
        """DELETE, only if the object is still the one `only_if` names (409 Conflict if not)."""
        await self.send(Request("DELETE", res, namespace, name, body=only_if.options()))

    async def patch(
        self, res: Resource, name: str, body: Obj, *, namespace: str | None = None
    ) -> Obj:
        """Merge-patch an object (no resourceVersion: last writer wins; an Event's count)."""
        req = Request("PATCH", res, namespace, name, body=body, content_type=MERGE_PATCH)
        return await self.send(req)

    async def patch_status(
        self, res: Resource, name: str, status: Obj, *, namespace: str | None = None
    ) -> Obj:
        """Merge-patch an object's status subresource (one write per reconcile at most)."""
        body = {"status": status}
        req = Request("PATCH", res, namespace, name, "status", body=body, content_type=MERGE_PATCH)
        return await self.send(req)

    async def apply(self, res: Resource, body: Obj, *, namespace: str, field_manager: str) -> Obj:
        """Server-side apply (JSON is YAML): `field_manager` then owns exactly the fields sent.

        The body's metadata names the object; the apply is forced.
        """
        name = str(body["metadata"]["name"])
        query = (("fieldManager", field_manager), ("force", "true"))
        return await self.send(
            Request("PATCH", res, namespace, name, query=query, body=body, content_type=APPLY_PATCH)
        )


async def collect(pages: AsyncIterator[tuple[list[Obj], str]]) -> tuple[list[Obj], str]:
    """Every object of a paged list at once, and the list's resourceVersion (for tools)."""
    items: list[Obj] = []
    version = ""
    async for page, rv in pages:
        items.extend(page)
        version = rv
    return items, version
