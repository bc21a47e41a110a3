"""The API server as projector's code sees it: where kinds live, raw objects, and a Protocol.

`kube.Kube` implements `Api` over HTTP; the store, the writer and the controller depend only on
this Protocol, so unit tests drive their error handling with a small in-memory double while
integration tests use the real API server. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

Obj = dict[str, Any]
"""A raw Kubernetes object as decoded from JSON."""


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind lives in the API: group/version, plural, and whether it is namespaced."""

    version: str
    plural: str
    namespaced: bool
    kind: str

    def url(self, name: str | None = None, subresource: str | None = None) -> str:
        """The part of the path after the namespace."""
        return "/".join(p for p in (self.plural, name, subresource) if p)


SECRETS = Resource("v1", "secrets", True, "Secret")
CONFIGMAPS = Resource("v1", "configmaps", True, "ConfigMap")
BY_KIND = {SECRETS.kind: SECRETS, CONFIGMAPS.kind: CONFIGMAPS}
"""The resource of a source's kind (`model.SourceKind` values), which is its copies' too."""
NAMESPACES = Resource("v1", "namespaces", False, "Namespace")
EVENTS = Resource("v1", "events", True, "Event")
LEASES = Resource("coordination.k8s.io/v1", "leases", True, "Lease")
GRANTS = Resource("projector.nebari.dev/v1alpha1", "projectiongrants", False, "ProjectionGrant")
DEPLOYMENTS = Resource("apps/v1", "deployments", True, "Deployment")
STATEFULSETS = Resource("apps/v1", "statefulsets", True, "StatefulSet")
DAEMONSETS = Resource("apps/v1", "daemonsets", True, "DaemonSet")


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


class Api(Protocol):
    """The calls projector makes; each raises `projector.errors.ApiError` subclasses only."""

    def pages(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        metadata_only: bool = False,
        limit: int = 500,
    ) -> AsyncGenerator[tuple[list[Obj], str], None]:
        """A list, one page of at most `limit` objects at a time, with the list's version.

        Raises `Gone` if the list expired before its last page.
        """
        ...

    def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        read_deadline: float = 60.0,
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """("OPEN", {}) once accepted, then (type, object) per event until the watch ends."""
        ...

    async def get(
        self, res: Resource, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> Obj:
        """Read one object."""
        ...

    async def create(
        self,
        res: Resource,
        body: Obj | bytes,
        *,
        namespace: str | None = None,
        metadata_only: bool = False,
    ) -> Obj:
        """POST a new object (a dict, or its JSON already encoded).

        With `metadata_only`, the answer carries the object's metadata alone.
        """
        ...

    async def replace(
        self,
        res: Resource,
        body: Obj | bytes,
        *,
        namespace: str | None = None,
        name: str | None = None,
        metadata_only: bool = False,
    ) -> Obj:
        """PUT the whole object, conditional on its metadata.resourceVersion.

        `name` is needed only when `body` is already encoded.
        """
        ...

    async def delete(
        self, res: Resource, name: str, *, namespace: str | None = None, only_if: Precondition = ANY
    ) -> None:
        """DELETE, only if the object is still the one `only_if` names (409 Conflict if not)."""
        ...

    async def patch_status(self, res: Resource, name: str, status: Obj) -> Obj:
        """Merge-patch a cluster-scoped object's status subresource."""
        ...

    async def apply(self, res: Resource, body: Obj, *, namespace: str, field_manager: str) -> Obj:
        """Server-side apply `body` (its metadata names the object) as `field_manager`, forced."""
        ...


async def collect(pages: AsyncIterator[tuple[list[Obj], str]]) -> tuple[list[Obj], str]:
    """Every object of a paged list at once, and the list's resourceVersion (for tools)."""
    items: list[Obj] = []
    version = ""
    async for page, rv in pages:
        items.extend(page)
        version = rv
    return items, version
