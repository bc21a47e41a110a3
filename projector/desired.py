"""The desired copy: what a grant's copy holds, its hash, and the Secret sent for it.

Pure: built once per grant from its source (`desired_copy`), identical in every namespace but
for metadata.namespace; `Desired.in_sync` tells from a cached copy's metadata alone whether it
already holds exactly this.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from projector.model import (
    GRANT_LABEL,
    GRANT_METADATA_ANNOTATION,
    GRANT_UID_ANNOTATION,
    HASH_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ON_REVOKE_ANNOTATION,
    ON_SOURCE_DELETED_ANNOTATION,
    PREFIX,
    SOURCE_ANNOTATION,
    Copy,
    Grant,
    Source,
    content_hash,
)

UNCOPYABLE_TYPES = frozenset(
    {"kubernetes.io/service-account-token", "bootstrap.kubernetes.io/token"}
)
"""Types the API server ties to their namespace; their copies are plain Opaque Secrets."""


@dataclass(frozen=True, slots=True)
class Desired:
    """The copy a grant wants; identical in every namespace but for metadata.namespace."""

    name: str
    type: str
    data: Mapping[str, str] = field(repr=False)
    """The Secret's values: never in a log, an error message or a repr."""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    hash: str
    """Over everything written: the content-hash annotation."""
    core_hash: str
    """Over type, data and projector's own metadata: compared with a copy's observed hash."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    extra_annotations: Mapping[str, str] = field(default_factory=dict)

    def in_sync(self, copy: Copy) -> bool:
        """Tell whether a stored copy already holds exactly this content and our metadata."""
        if copy.observed_hash != self.core_hash:
            return False
        notes = copy.annotations
        if notes.get(HASH_ANNOTATION) != self.hash:
            return False
        if self.extra_labels:
            labels = copy.labels
            if any(labels.get(k) != v for k, v in self.extra_labels.items()):
                return False
        return not self.extra_annotations or all(
            notes.get(k) == v for k, v in self.extra_annotations.items()
        )

    def manifest(
        self,
        namespace: str,
        resource_version: str | None = None,
        keep: Copy | None = None,
        *,
        with_data: bool = True,
    ) -> dict[str, object]:
        """The Secret to send; with a resourceVersion, a PUT that fails if the copy moved on.

        Labels and annotations others added to `keep` (the stored copy) are carried over:
        a PUT must not erase what other tools wrote, only restore what is ours. Without data,
        for a writer that serializes the data once for every namespace.
        """
        labels, annotations = dict(self.labels), dict(self.annotations)
        if keep is not None:
            was = _grant_metadata(keep)
            labels = _foreign(keep.labels, was.get("labels", ())) | labels
            annotations = _foreign(keep.annotations, was.get("annotations", ())) | annotations
        meta: dict[str, object] = {
            "name": self.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        out: dict[str, object] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": self.type,
        }
        if with_data:
            out["data"] = dict(self.data)
        return out


def _foreign(metadata: Mapping[str, str], grants: Iterable[str]) -> dict[str, str]:
    """Keys other tools wrote: neither projector's own nor ones a grant wrote before."""
    skip = set(grants)
    return {k: v for k, v in metadata.items() if not k.startswith(PREFIX) and k not in skip}


def _grant_metadata(copy: Copy) -> dict[str, list[str]]:
    try:
        recorded = json.loads(copy.annotations.get(GRANT_METADATA_ANNOTATION, "{}"))
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


def desired_copy(grant: Grant, source: Source) -> Desired | str:
    """Build the copy for a grant, or name the first key the source lacks."""
    if grant.keys is None:
        data = dict(source.data)
        type_ = source.type
    else:
        data = {}
        for k in grant.keys:
            if k.src not in source.data:
                return k.src
            data[k.dst] = source.data[k.src]
        whole = {k.src for k in grant.keys} == set(source.data) and all(
            k.src == k.dst for k in grant.keys
        )
        type_ = source.type if whole else "Opaque"
    if type_ in UNCOPYABLE_TYPES:
        type_ = "Opaque"
    ours = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, GRANT_LABEL: grant.name}
    our_notes = {
        GRANT_UID_ANNOTATION: grant.uid,
        SOURCE_ANNOTATION: str(source.key),
        ON_REVOKE_ANNOTATION: grant.on_revoke.value,
        ON_SOURCE_DELETED_ANNOTATION: grant.on_source_deleted.value,
    }
    # Reserved keys are refused by parse_grant; dropping them here keeps in_sync reachable.
    extra_labels = {k: v for k, v in grant.labels if not k.startswith(PREFIX)}
    extra_notes = {k: v for k, v in grant.annotations if not k.startswith(PREFIX)}
    if extra_labels or extra_notes:
        our_notes[GRANT_METADATA_ANNOTATION] = json.dumps(
            {"labels": sorted(extra_labels), "annotations": sorted(extra_notes)},
            separators=(",", ":"),
        )
    labels = extra_labels | ours
    annotations = extra_notes | our_notes
    digest = content_hash(type_, data, labels, annotations)
    core = content_hash(type_, data, ours, our_notes)
    annotations[HASH_ANNOTATION] = digest
    return Desired(
        grant.target_name, type_, data, labels, annotations, digest, core, extra_labels, extra_notes
    )
