"""The only module that talks HTTP to the API server.

kr8s gives configuration, authentication (kubeconfig, in-cluster, token refresh) and the httpx
session; on top of it this module adds what a controller needs and kr8s lacks: watches with
bookmarks, server timeouts and a client read deadline, metadata-only reads, PUT with optimistic
concurrency, deletes with preconditions, a client-side rate limit (qps/burst), and errors mapped
to `projector.errors` so nothing above this layer knows httpx or kr8s exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import httpx
import kr8s
import kr8s.asyncio

from projector import __version__
from projector.api import Obj, Resource
from projector.errors import ApiError, ProjectorError, ServerError, api_error
from projector.model import FIELD_MANAGER

_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class TokenBucket:
    """Client-side rate limit (client-go's qps/burst), so one controller cannot flood the server."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Wait for a token; qps <= 0 means unlimited."""
        if self.qps <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.qps)
                self._tokens = 1
                self._last = time.monotonic()
            self._tokens -= 1


RequestHook = Callable[[str, str, int], None]
"""Called after each request with (verb, resource plural, status code; 0 = no response)."""


class Kube:
    """The `projector.api.Api` over kr8s' httpx session (plus `patch`, for benchmarks)."""

    def __init__(
        self,
        api: kr8s.asyncio.Api,
        *,
        qps: float = 0.0,
        burst: int = 100,
        timeout: float = 30.0,
        on_request: RequestHook | None = None,
        identity: str = "",
    ) -> None:
        self._api = api
        self._limit = TokenBucket(qps, burst)
        self._timeout = timeout
        self._on_request = on_request
        self._user_agent = f"projector/{__version__} ({identity})" if identity else "projector"
        """Names the replica in the API server's audit log: who wrote what, after which lease."""

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, **kw: Any) -> Kube:
        """Build from a kubeconfig path, or in-cluster config, or $KUBECONFIG (kr8s' order)."""
        try:
            api = await kr8s.asyncio.api(kubeconfig=kubeconfig)
        except Exception as e:  # kr8s reports a bad kubeconfig as anything from KeyError up
            raise ProjectorError(
                f"cannot load credentials or reach the API server: {type(e).__name__}: {e}"
            ) from e
        return cls(api, **kw)

    def _record(self, verb: str, res: Resource, code: int) -> None:
        if self._on_request is not None:
            self._on_request(verb, res.plural, code)

    @contextlib.contextmanager
    def _mapped(self, verb: str, res: Resource, lost: str) -> Iterator[None]:
        """Turn kr8s' and httpx's errors into ours (the only place that knows them), counted."""
        try:
            yield
        except kr8s.ServerError as e:
            err = _from_response(e.response)
            self._record(verb, res, err.status)
            raise err from None
        except (httpx.HTTPError, kr8s._exceptions.APITimeoutError, OSError) as e:
            self._record(verb, res, 0)
            raise ServerError(0, type(e).__name__, str(e) or lost) from None

    async def _request(
        self,
        verb: str,
        method: str,
        res: Resource,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        params: Mapping[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Obj:
        await self._limit.acquire()
        kwargs: dict[str, Any] = {
            "headers": {
                "Content-Type": content_type,
                "Accept": accept,
                "User-Agent": self._user_agent,
            },
            "timeout": self._timeout,
        }
        if params:
            kwargs["params"] = dict(params)
        if body is not None:
            kwargs["content"] = json.dumps(body)
        with self._mapped(verb, res, "no response"):
            async with self._api.call_api(
                method,
                version=res.version,
                namespace=namespace if res.namespaced else None,
                url=res.url(name, subresource),
                **kwargs,
            ) as response:
                self._record(verb, res, response.status_code)
                return response.json() if response.content else {}

    async def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        metadata_only: bool = False,
        page: int = 500,
    ) -> tuple[list[Obj], str]:
        """List every object, page by page; returns the items and the list's resourceVersion."""
        items: list[Obj] = []
        params = {"limit": str(page)}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            out = await self._request(
                "LIST",
                "GET",
                res,
                namespace=namespace,
                params=params,
                accept=_METADATA_LIST if metadata_only else "application/json",
            )
            items.extend(out.get("items") or ())
            meta = out.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = meta["continue"]

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        read_deadline: float = 60.0,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Yield (type, object) from one watch request, BOOKMARKs included, until it ends.

        The first item is ("OPEN", {}) once the server has accepted the watch.

        The server ends the watch after `timeoutSeconds`; a connection that goes silent for
        `read_deadline` seconds (bookmarks arrive about every minute) raises instead of hanging,
        so a stalled watch is always detected. A 410 raises `Gone`: the caller must relist.
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        timeout = httpx.Timeout(self._timeout, read=read_deadline)
        await self._limit.acquire()
        with self._mapped("WATCH", res, "watch connection lost"):
            async with self._api.call_api(
                "GET",
                version=res.version,
                url=res.url(),
                params=params,
                stream=True,
                headers={"User-Agent": self._user_agent},
                timeout=timeout,
            ) as response:
                self._record("WATCH", res, response.status_code)
                yield "OPEN", {}
                async for line in response.aiter_lines():
                    if not line:
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise ServerError(0, "BadWatchEvent", "undecodable watch event") from None
                    kind, obj = event.get("type", ""), event.get("object") or {}
                    if kind == "ERROR":
                        raise _from_status(obj)
                    yield kind, obj

    async def get(
        self, res: Resource, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> Obj:
        """Read one object; metadata-only never transfers a Secret's data."""
        accept = _METADATA_ONLY if metadata_only else "application/json"
        return await self._request("GET", "GET", res, namespace=namespace, name=name, accept=accept)

    async def create(self, res: Resource, body: Obj, *, namespace: str | None = None) -> Obj:
        """POST a new object (409 AlreadyExists if the name is taken)."""
        params = {"fieldManager": FIELD_MANAGER}
        return await self._request(
            "CREATE", "POST", res, namespace=namespace, params=params, body=body
        )

    async def replace(self, res: Resource, body: Obj, *, namespace: str | None = None) -> Obj:
        """PUT the whole object; its metadata.resourceVersion makes a stale write fail with 409."""
        params = {"fieldManager": FIELD_MANAGER}
        name = body["metadata"]["name"]
        return await self._request(
            "UPDATE", "PUT", res, namespace=namespace, name=name, params=params, body=body
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """DELETE, only if the object is still the one we decided about (uid/rv preconditions)."""
        pre: dict[str, str] = {}
        if uid:
            pre["uid"] = uid
        if resource_version:
            pre["resourceVersion"] = resource_version
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": pre}
        await self._request("DELETE", "DELETE", res, namespace=namespace, name=name, body=body)

    async def patch(
        self, res: Resource, name: str, body: Obj, *, namespace: str | None = None
    ) -> Obj:
        """Merge-patch an object (no resourceVersion: last writer wins)."""
        return await self._request(
            "PATCH",
            "PATCH",
            res,
            namespace=namespace,
            name=name,
            body=body,
            content_type="application/merge-patch+json",
        )

    async def patch_status(self, res: Resource, name: str, status: Obj) -> Obj:
        """Merge-patch the status subresource (one write per reconcile)."""
        return await self._request(
            "PATCH",
            "PATCH",
            res,
            name=name,
            subresource="status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def close(self) -> None:
        """Close the HTTP session."""
        session = getattr(self._api, "_session", None)
        if session is not None:
            await session.aclose()


def _causes(status: Mapping[str, Any]) -> tuple[str, ...]:
    details = status.get("details") or {}
    return tuple(str(c.get("reason", "")) for c in details.get("causes") or () if c)


def _from_status(status: Mapping[str, Any]) -> ApiError:
    """Map a metav1.Status (from a body or an in-stream watch ERROR) to our error tree."""
    code = int(status.get("code") or 0)
    return api_error(
        code, str(status.get("reason", "")), str(status.get("message", "")), _causes(status)
    )


def _from_response(response: httpx.Response | None) -> ApiError:
    if response is None:
        return ServerError(0, "NoResponse", "")
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    retry_after = 1.0
    header = response.headers.get("Retry-After")
    if header:
        try:
            retry_after = max(0.0, float(header))
        except ValueError:
            retry_after = 1.0
    return api_error(
        response.status_code,
        str(body.get("reason", response.reason_phrase)),
        str(body.get("message", "")),
        _causes(body),
        retry_after,
    )
