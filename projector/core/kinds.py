"""Where each kind projector touches lives in the API, and the raw object type.

Pure values: the client builds paths from them, the core names the resource of a source's kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
"""A raw Kubernetes object as decoded from JSON."""


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind lives in the API: group/version, plural, and whether it is namespaced."""

    version: str
    plural: str
    namespaced: bool
    kind: str

    @property
    def root(self) -> str:
        """The path its group and version are served under."""
        return "/api/v1" if self.version == "v1" else f"/apis/{self.version}"

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
EXPORTS = Resource("projector.nebari.dev/v1alpha1", "projectionexports", True, "ProjectionExport")
DEPLOYMENTS = Resource("apps/v1", "deployments", True, "Deployment")
STATEFULSETS = Resource("apps/v1", "statefulsets", True, "StatefulSet")
DAEMONSETS = Resource("apps/v1", "daemonsets", True, "DaemonSet")
TOKENREVIEWS = Resource("authentication.k8s.io/v1", "tokenreviews", False, "TokenReview")
SUBJECTACCESSREVIEWS = Resource(
    "authorization.k8s.io/v1", "subjectaccessreviews", False, "SubjectAccessReview"
)
