"""The API server's answers, read: watch event lines, errors from Status objects.

Pure but for reading a watch stream; the client (`kube`) sends, this reads what came back.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import orjson

from projector.core.kinds import Obj
from projector.errors import ApiError, ServerError, api_error


async def watch_lines(content: aiohttp.StreamReader) -> AsyncGenerator[tuple[str, Obj], None]:
    """The events of a watch stream, one JSON line each, whatever their size.

    aiohttp's readline refuses lines over 128 KiB, so chunks are split here: the parts of a
    line are kept as a list and joined once (linear, where `buffer += chunk` copied a 1 MiB
    event again for every chunk), and nothing of an event is held once it is decoded.
    """
    parts: list[bytes] = []
    async for chunk in content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            parts.append(chunk[start:end])
            line = b"".join(parts)
            parts.clear()
            start = end + 1
            if line.strip():
                event = watch_event(line)
                del line
                yield event
                del event
        if start < len(chunk):
            parts.append(chunk[start:] if start else chunk)


def watch_event(line: bytes) -> tuple[str, Obj]:
    """One watch line as (type, object); an in-stream ERROR raises what its Status says."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise ServerError(0, "BadWatchEvent", "undecodable watch event") from e
    kind, obj = event.get("type", ""), event.get("object") or {}
    if kind == "ERROR":
        raise from_status(obj)
    return kind, obj


def _causes(status: Mapping[str, Any]) -> tuple[str, ...]:
    details = status.get("details") or {}
    return tuple(str(c.get("reason", "")) for c in details.get("causes") or () if c)


def from_status(status: Mapping[str, Any], code: int = 0, retry_after: float = 1.0) -> ApiError:
    """Map a metav1.Status (from a body or an in-stream watch ERROR) to our error tree."""
    return api_error(
        code or int(status.get("code") or 0),
        str(status.get("reason", "")),
        str(status.get("message", "")),
        _causes(status),
        retry_after,
    )


def from_body(code: int, raw: bytes | bytearray, retry_after: str | None) -> ApiError:
    """The error an HTTP status and its body (a metav1.Status, or anything) stand for."""
    try:
        status = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    try:
        delay = max(0.0, float(retry_after)) if retry_after else 1.0
    except ValueError:
        delay = 1.0
    return from_status(status, code, delay)
