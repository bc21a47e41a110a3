"""The install's hash key: read when a term starts, created once when its Secret is absent.

The copies' content-hash annotation is an HMAC under this key (`model.HashKey`), so that
nobody who reads a copy's metadata, or a workload's rollout stamp, can test guesses of a weak
value offline. The key lives in the Secret `projector-hash-key` in the controller's own
namespace, labelled `projector.nebari.dev/managed-by: projector` (the one Secret the admission
policy lets projector write there), immutable, 32 random bytes. The first replica to lead
creates it; replicas racing (no leader election) both try, and the one refused (409) reads the
winner's. A later term reuses the key its process read first.

A read or create that fails (the API server away, a 5xx, a lease lost meanwhile) is retried
with backoff and logged; no work is planned meanwhile. A Secret that holds no usable key is
fatal (it was edited by hand): deleting it makes projector create a new one, which rewrites
the annotation of every copy once, and rolls once the workloads that opted in. The key's bytes
are never logged, nor put in an error message.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets

import structlog

from projector.client.api import Api
from projector.client.retries import retry_delay
from projector.control.writer import Writer
from projector.core.kinds import SECRETS, Obj
from projector.core.model import (
    HASH_KEY_BYTES,
    HASH_KEY_FIELD,
    HASH_KEY_SECRET,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    HashKey,
)
from projector.errors import ApiError, Conflict, Fenced, NotFound, ProjectorError, ServerError

log = structlog.get_logger("projector")

BACKOFF = (0.2, 10.0)
"""First wait and cap between tries of a read or create that failed."""


def manifest(key: bytes) -> Obj:
    """The hash key's Secret: labelled as projector's, immutable (delete it to replace it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": HASH_KEY_SECRET, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
        "type": "Opaque",
        "immutable": True,
        "data": {HASH_KEY_FIELD: base64.b64encode(key).decode()},
    }


def parse(obj: Obj, namespace: str) -> HashKey:
    """The key a Secret holds; a Secret with no usable key is an error no retry mends."""
    raw = (obj.get("data") or {}).get(HASH_KEY_FIELD)
    try:
        key = base64.b64decode(raw or "", validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) < HASH_KEY_BYTES:
        raise ProjectorError(
            f"the Secret {namespace}/{HASH_KEY_SECRET} holds no usable hash key"
            f" (data.{HASH_KEY_FIELD}: at least {HASH_KEY_BYTES} bytes, base64);"
            " delete it and projector creates one"
        )
    return HashKey(key)


async def read(api: Api, namespace: str) -> HashKey | None:
    """The stored key, or None if its Secret does not exist."""
    try:
        obj = await api.get(SECRETS, HASH_KEY_SECRET, namespace=namespace)
    except NotFound:
        return None
    return parse(obj, namespace)


async def ensure_once(api: Api, writer: Writer, namespace: str) -> HashKey:
    """Read the key; if its Secret is absent, create it (through the writer, so fenced).

    Created meanwhile by another replica (409 AlreadyExists): that one's is read and used.
    """
    found = await read(api, namespace)
    if found is not None:
        log.info("hash key read", namespace=namespace, secret=HASH_KEY_SECRET)
        return found
    key = secrets.token_bytes(HASH_KEY_BYTES)
    try:
        await writer.create(SECRETS, manifest(key), namespace=namespace)
    except Conflict as e:
        if not e.already_exists:
            raise
        log.info("hash key created by another replica", namespace=namespace)
        found = await read(api, namespace)
        if found is None:  # created and deleted at once: start over
            raise NotFound(404, "NotFound", "the hash key was deleted as it was created") from e
        return found
    log.info("hash key created", namespace=namespace, secret=HASH_KEY_SECRET)
    return HashKey(key)


async def ensure(
    api: Api, writer: Writer, namespace: str, *, backoff: tuple[float, float] = BACKOFF
) -> HashKey:
    """`ensure_once`, retried with backoff until it succeeds (or this task is cancelled)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await ensure_once(api, writer, namespace)
        except (ApiError, Fenced) as e:  # a lost lease: the term ends, or it leads again
            error = e if isinstance(e, ApiError) else ServerError(0, "Fenced")
            delay = retry_delay(error, attempt, *backoff)
            log.warning(
                "hash key not read; no grant is reconciled until it is",
                namespace=namespace,
                secret=HASH_KEY_SECRET,
                status=error.status,
                reason=error.reason,
                attempt=attempt,
                retry_in=round(delay, 3),
            )
            await asyncio.sleep(delay)
