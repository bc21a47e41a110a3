"""The API as a narrow watch sees it: the objects of one name only (in one namespace, or all).

An informer lists and watches through it, and every request it makes is narrowed by
`fieldSelector=metadata.name=<name>`, moved into `namespace` if one is given, and asked as
metadata only (PartialObjectMetadata, with no plain-JSON fallback) if `metadata_only`: a server
that could not strip the data answers 406, and the watch fails rather than carry data it was
not meant to. Carried by the controller's own `Api`, so its rate limit and metrics hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator

from projector.client.api import Api, Request
from projector.core.kinds import Obj

WATCH_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
LIST_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class OneName(Api):
    """Lists and watches of one name's objects only; any other verb is a bug."""

    def __init__(
        self, api: Api, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._metadata_only = metadata_only
        self._selector = ("fieldSelector", f"metadata.name={name}")

    def _narrowed(self, req: Request) -> Request:
        if req.verb not in ("LIST", "WATCH"):
            raise ValueError(f"a narrow watch only lists and watches, not {req.verb}")
        query = (*req.query, self._selector)
        accept = req.accept
        if self._metadata_only:
            accept = LIST_METADATA if req.verb == "LIST" else WATCH_METADATA
        namespace = self._namespace if self._namespace is not None else req.namespace
        return dataclasses.replace(req, namespace=namespace, query=query, accept=accept)

    async def send(self, req: Request) -> Obj:
        """A list page of one name's objects."""
        return await self._api.send(self._narrowed(req))

    def stream(self, req: Request, read_deadline: float) -> AsyncGenerator[tuple[str, Obj], None]:
        """A watch of one name's objects."""
        return self._api.stream(self._narrowed(req), read_deadline)
