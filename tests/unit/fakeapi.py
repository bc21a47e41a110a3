"""A small in-memory transport for `projector.client.api.Api`, for unit tests of error handling
only.

`Api` shapes each call exactly as for the real API server; this answers the request.

It keeps objects with uids and resourceVersions, honours create/replace/delete preconditions
the way the API server does (AlreadyExists, stale resourceVersion, uid precondition), and
raises scripted errors on the next calls of a verb: the cases a real server will not produce
on demand (a 5xx, a 429 with Retry-After, a timeout). Integration tests never use it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import defaultdict
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from projector.client.api import APPLY_PATCH, Api, Precondition, Request
from projector.core.kinds import Obj, Resource
from projector.errors import ApiError, Conflict, NotFound

Key = tuple[str, str, str]
"""(plural, namespace, name)"""


class FakeApi(Api):
    """`Api`'s requests answered from objects by (plural, namespace, name); `fail(verb, error)`
    scripts the next failures."""

    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self.calls: list[tuple[str, str, str]] = []
        """(verb, plural, name) of every call, failed ones included."""
        self._errors: defaultdict[str, list[ApiError | None]] = defaultdict(list)
        self._rv = itertools.count(100)
        self._uid = itertools.count(1)
        self._lists: dict[str, list[Key]] = {}
        """The keys a list matched, by its resourceVersion (a continue token names both)."""

    def fail(self, verb: str, *errors: ApiError | None) -> None:
        """Raise `errors`, one per call, on the next calls of `verb` (GET, CREATE, ...).

        A None lets that call through, so a later call of the same verb can fail.
        """
        self._errors[verb].extend(errors)

    def add(self, res: Resource, obj: Obj) -> Obj:
        """Store an object as if someone else had created it."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[res.plural, meta.get("namespace", ""), meta["name"]] = obj
        return obj

    def _call(self, verb: str, res: Resource, name: str = "") -> None:
        self.calls.append((verb, res.plural, name))
        if self._errors[verb] and (error := self._errors[verb].pop(0)) is not None:
            raise error

    def _get(self, res: Resource, namespace: str | None, name: str) -> Obj:
        obj = self.objects.get((res.plural, namespace or "", name))
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        return obj

    async def send(self, req: Request) -> Obj:
        """Answer one request as the API server would, after counting it (and maybe failing it).

        Timeouts and the shape of an answer (metadata alone) mean nothing in memory: a write
        is always answered whole, and so is a list.
        """
        body = orjson.loads(req.body) if isinstance(req.body, bytes) else req.body
        name = req.name or (str(body["metadata"]["name"]) if body else "")
        verb = req.verb
        if req.subresource == "status":
            verb = "PATCH_STATUS"
        elif req.content_type == APPLY_PATCH:
            verb = "APPLY"
        self._call(verb, req.res, name)
        res, namespace, query = req.res, req.namespace, dict(req.query)
        if verb == "LIST":
            return self._page(res, namespace, query)
        if verb == "GET":
            obj = copy.deepcopy(self._get(res, namespace, name))
            return {"metadata": obj["metadata"]} if "PartialObjectMetadata" in req.accept else obj
        assert body is not None, f"{verb} without a body"
        if verb == "CREATE":
            if (res.plural, namespace or "", name) in self.objects:
                raise Conflict(409, "AlreadyExists", f'{res.plural} "{name}" already exists')
            obj = copy.deepcopy(body)
            obj["metadata"]["namespace"] = namespace or ""
            return copy.deepcopy(self.add(res, obj))
        old = self._get(res, namespace, name)
        if verb == "DELETE":
            pre = body.get("preconditions", {})
            if not Precondition(pre.get("uid", ""), pre.get("resourceVersion", "")).holds(
                old["metadata"]
            ):
                raise Conflict(409, "Conflict", "precondition failed")
            del self.objects[res.plural, namespace or "", name]
            return {}
        if verb == "UPDATE":
            if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", "the object has been modified")
            obj = copy.deepcopy(body)
            obj["metadata"] |= {"uid": old["metadata"]["uid"], "namespace": namespace or ""}
            self.objects[res.plural, namespace or "", name] = old = obj
        elif verb == "PATCH_STATUS":
            old["status"] = copy.deepcopy(body["status"])
            return copy.deepcopy(old)
        else:  # APPLY, or a merge patch
            _merge(old, copy.deepcopy(body))
        old["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(old)

    def _page(self, res: Resource, namespace: str | None, query: dict[str, str]) -> Obj:
        """One page of a list: the keys matched on the first page, `limit` at a time."""
        limit = int(query["limit"])
        if "continue" in query:
            rv, start = query["continue"].split(":")
            keys = self._lists[rv]
        else:
            want = dict(p.split("=", 1) for p in query.get("labelSelector", "").split(",") if p)
            keys = sorted(
                key
                for key, o in self.objects.items()
                if key[0] == res.plural
                and (namespace is None or key[1] == namespace)
                and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
            )
            rv, start = str(next(self._rv)), "0"
            self._lists[rv] = keys
        end = int(start) + limit
        meta = {"resourceVersion": rv} | ({"continue": f"{rv}:{end}"} if end < len(keys) else {})
        page = (copy.deepcopy(self.objects[k]) for k in keys[int(start) : end] if k in self.objects)
        items = list(page)
        return {"kind": f"{res.kind}List", "metadata": meta, "items": items}

    async def stream(
        self, req: Request, read_deadline: float
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """A quiet watch."""
        self._call("WATCH", req.res)
        yield "OPEN", {}
        await asyncio.Event().wait()

    def get_object(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object, for assertions."""
        return self.objects.get((res.plural, namespace, name))


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge maps recursively, as server-side apply merges the maps it is sent."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
