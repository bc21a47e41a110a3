"""A small in-memory double of `projector.api.Api`, for unit tests of error handling only.

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

from projector.api import ANY, Obj, Precondition, Resource, collect
from projector.errors import ApiError, Conflict, NotFound

Key = tuple[str, str, str]
"""(plural, namespace, name)"""


class FakeApi:
    """Objects by (plural, namespace, name); `fail(verb, error)` scripts the next failures."""

    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self.calls: list[tuple[str, str, str]] = []
        """(verb, plural, name) of every call, failed ones included."""
        self._errors: defaultdict[str, list[ApiError | None]] = defaultdict(list)
        self._rv = itertools.count(100)
        self._uid = itertools.count(1)

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

    # Each call takes the keywords of `Api`'s that it uses; the rest (timeouts, the shape of
    # the answer) mean nothing in memory and are taken as `**_`.

    async def pages(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        limit: int = 500,
        **_: object,
    ) -> AsyncGenerator[tuple[list[Obj], str], None]:
        """One LIST call per page of `limit` (whole objects, even when metadata alone is asked).

        An error scripted for a later call fails the list midway (`Gone`: the continue token
        expired).
        """
        want = dict(p.split("=", 1) for p in (label_selector or "").split(",") if p)
        keys = sorted(
            key
            for key, o in self.objects.items()
            if key[0] == res.plural
            and (namespace is None or key[1] == namespace)
            and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
        )
        rv = str(next(self._rv))
        for start in range(0, max(len(keys), 1), limit):
            self._call("LIST", res)
            page = keys[start : start + limit]
            yield [copy.deepcopy(self.objects[k]) for k in page if k in self.objects], rv

    async def list(self, res: Resource, **kw: Any) -> tuple[list[Obj], str]:
        """Every page at once (for assertions)."""
        return await collect(self.pages(res, **kw))

    async def watch(self, res: Resource, **_: object) -> AsyncGenerator[tuple[str, Obj], None]:
        self._call("WATCH", res)
        yield "OPEN", {}
        await asyncio.Event().wait()  # a quiet watch

    async def get(
        self, res: Resource, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> Obj:
        self._call("GET", res, name)
        obj = copy.deepcopy(self._get(res, namespace, name))
        return {"metadata": obj["metadata"]} if metadata_only else obj

    def _write(self, verb: str, res: Resource, body: Obj | bytes) -> tuple[Obj, str]:
        """The body decoded, and its name, once the call is counted (and maybe failed)."""
        body = orjson.loads(body) if isinstance(body, bytes) else body
        name = str(body["metadata"]["name"])
        self._call(verb, res, name)
        return body, name

    async def create(
        self, res: Resource, body: Obj | bytes, *, namespace: str | None = None, **_: object
    ) -> Obj:
        body, name = self._write("CREATE", res, body)
        if (res.plural, namespace or "", name) in self.objects:
            raise Conflict(409, "AlreadyExists", f'{res.plural} "{name}" already exists')
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = namespace or ""
        return copy.deepcopy(self.add(res, obj))

    async def replace(
        self, res: Resource, body: Obj | bytes, *, namespace: str | None = None, **_: object
    ) -> Obj:
        body, name = self._write("UPDATE", res, body)
        old = self._get(res, namespace, name)
        if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        obj = copy.deepcopy(body)
        obj["metadata"] |= {"uid": old["metadata"]["uid"], "namespace": namespace or ""}
        self.objects[res.plural, namespace or "", name] = obj
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

    async def delete(
        self, res: Resource, name: str, *, namespace: str | None = None, only_if: Precondition = ANY
    ) -> None:
        self._call("DELETE", res, name)
        if not only_if.holds(self._get(res, namespace, name)["metadata"]):
            raise Conflict(409, "Conflict", "precondition failed")
        del self.objects[res.plural, namespace or "", name]

    async def patch_status(self, res: Resource, name: str, status: Obj) -> Obj:
        self._call("PATCH_STATUS", res, name)
        obj = self._get(res, None, name)
        obj["status"] = copy.deepcopy(status)
        return copy.deepcopy(obj)

    async def apply(self, res: Resource, body: Obj, *, namespace: str, field_manager: str) -> Obj:
        body, name = self._write("APPLY", res, body)
        obj = self._get(res, namespace, name)
        _merge(obj, copy.deepcopy(body))
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

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
