"""The keyed content hash (issue 36): the annotation projector writes is an HMAC under the
install's key, an upgrade over copies carrying the unkeyed hash of earlier versions rewrites
nothing (compared exactly), and the key's Secret is read, or created once, before any plan."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac

import pytest
import structlog

from projector.client.api import Request
from projector.config import Config
from projector.control import hashkey
from projector.control.writer import Writer
from projector.core.desired import Desired, desired_copy
from projector.core.kinds import SECRETS, Obj
from projector.core.model import (
    HASH_ANNOTATION,
    HASH_KEY_SECRET,
    MANAGED_BY_LABEL,
    Copy,
    Grant,
    HashKey,
    Source,
    content_bytes,
    content_hash,
)
from projector.core.plans import Action, Result
from projector.core.reconcile import plan
from projector.errors import ProjectorError, ServerError
from projector.rollout.decide import decide, seen_key, stamp_key, stamp_of
from projector.telemetry.metrics import Metrics
from tests.unit.factories import (
    b64,
    copy_from,
    desired_of,
    make_grant,
    make_snapshot,
    make_source,
    namespaces,
)
from tests.unit.fakeapi import FakeApi
from tests.unit.test_controller import controller, world
from tests.unit.test_rollout import workload

KEY = HashKey(b"\x01" * 32)
OTHER = HashKey(b"\x02" * 32)
G = make_grant(namespaces=("a", "b", "c"), labels={"team": "x"})
S = make_source()


def keyed(grant: Grant = G, source: Source = S, key: HashKey = KEY) -> Desired:
    built = desired_copy(grant, source, key)
    assert isinstance(built, Desired)
    return built


# --- the key and the annotation ------------------------------------------------------------------


def test_the_key_is_never_in_a_repr_and_is_long_enough() -> None:
    secret = b"s3cr3t-bytes-of-the-install-key!"
    assert secret not in repr(HashKey(secret)).encode()
    with pytest.raises(ValueError, match="at least 32 bytes") as e:
        HashKey(b"short")
    assert "short" not in str(e.value)


def test_the_annotation_is_an_hmac_of_what_the_unkeyed_hash_covered() -> None:
    d = keyed()
    unkeyed = desired_of(G, S)  # as versions before the key wrote it
    blob = content_bytes(d.type, d.data, d.labels, d.annotations)
    assert d.annotations[HASH_ANNOTATION] == d.hash
    assert d.hash == "hmac-sha256:" + hmac.new(KEY.secret, blob, hashlib.sha256).hexdigest()
    assert d.legacy_hash == unkeyed.hash == "sha256:" + hashlib.sha256(blob).hexdigest()
    assert keyed(key=OTHER).hash != d.hash  # another install, another annotation
    assert d.core_hash == unkeyed.core_hash  # in memory only: the same as ever


def test_a_guess_of_the_value_no_longer_reproduces_the_annotation() -> None:
    """The offline attack: recompute the unkeyed hash of a guessed value and compare."""
    d = keyed(source=make_source(data={"token": b64("hunter2")}))
    guess = make_source(data={"token": b64("hunter2")})
    g = desired_of(G, guess)
    assert g.hash != d.hash and g.hash == d.legacy_hash  # what an attacker can compute
    meta = {k: v for k, v in d.annotations.items() if k != HASH_ANNOTATION}
    assert content_hash(d.type, d.data, d.labels, meta) != d.hash


# --- in sync: keyed, the unkeyed hash of earlier versions, exactly -------------------------------

D = keyed()
LEGACY = desired_of(G, S)
"""The same copy as the version before the key wrote it: its annotation is the unkeyed hash."""
CHANGED = keyed(source=make_source(data={"token": b64("t1"), "url": b64("http://hub")}))


@pytest.mark.parametrize(
    ("copy", "in_sync"),
    [
        pytest.param(copy_from(D, "a"), True, id="keyed"),
        pytest.param(copy_from(LEGACY, "a"), True, id="unkeyed-of-the-same-content"),
        pytest.param(copy_from(keyed(key=OTHER), "a"), False, id="keyed-under-another-key"),
        pytest.param(
            copy_from(LEGACY, "a", annotations={HASH_ANNOTATION: LEGACY.hash.upper()}),
            False,
            id="unkeyed-not-exactly",
        ),
        pytest.param(
            copy_from(LEGACY, "a", annotations={HASH_ANNOTATION: "sha256:" + "0" * 64}),
            False,
            id="unkeyed-of-other-content",
        ),
        pytest.param(copy_from(LEGACY, "a", data={"token": b64("edited")}), False, id="edited"),
        pytest.param(copy_from(LEGACY, "a", annotations={HASH_ANNOTATION: None}), False, id="none"),
    ],
)
def test_in_sync_takes_the_keyed_hash_and_exactly_the_unkeyed_one(
    copy: Copy, in_sync: bool
) -> None:
    assert D.in_sync(copy) is in_sync
    assert D.echo().in_sync(copy) is in_sync  # what the controller keeps tells the same
    assert D.stamped(copy.annotations.get(HASH_ANNOTATION)) is (
        copy.annotations.get(HASH_ANNOTATION) in (D.hash, D.legacy_hash)
    )


def test_an_upgrade_over_unkeyed_copies_writes_nothing_until_the_content_changes() -> None:
    copies = [copy_from(LEGACY, n) for n in ("a", "b", "c")]
    snap = make_snapshot(G, S, namespaces=namespaces("a", "b", "c"), copies=copies)
    assert plan(snap, KEY).writes == ()
    changed = make_source(data={"token": b64("t1"), "url": b64("http://hub")})
    snap = make_snapshot(G, changed, namespaces=namespaces("a", "b", "c"), copies=copies)
    after = plan(snap, KEY)
    assert {s.action for s in after.writes} == {Action.UPDATE}
    assert after.desired is not None and after.desired.hash.startswith("hmac-sha256:")


def test_an_upgrade_rolls_no_workload() -> None:
    """A workload rolled for a copy before the upgrade keeps its stamp: the copy is not
    rewritten, and its stamp is derived from its annotation; new content rolls it."""
    before = copy_from(LEGACY, "a")
    stamp = stamp_of(before.annotations[HASH_ANNOTATION], before.uid)
    w = workload((G.target_name,), stamps={stamp_key(G.target_name): stamp})
    assert plan(make_snapshot(G, S, namespaces=namespaces("a"), copies=[before]), KEY).writes == ()
    assert decide(w, {G.target_name: stamp}).rolled == ()
    after = copy_from(CHANGED, "a")
    rolled = decide(w, {G.target_name: stamp_of(after.annotations[HASH_ANNOTATION], after.uid)})
    assert rolled.rolled == (G.target_name,)
    assert seen_key(G.target_name) in dict(rolled.seen)


@pytest.mark.parametrize(
    ("copy", "in_sync"),
    [
        pytest.param(copy_from(D, "a"), True, id="keyed-same-content"),
        pytest.param(copy_from(CHANGED, "a"), False, id="keyed-other-content"),
        pytest.param(copy_from(LEGACY, "a"), True, id="unkeyed-same-content"),
    ],
)
def test_without_the_key_explain_compares_the_content(copy: Copy, in_sync: bool) -> None:
    """`projector explain` never needs the key: a keyed annotation it cannot recompute is taken
    as in sync when the content it covers is (the unkeyed hash recomputed from the copy)."""
    assert LEGACY.in_sync(copy) is in_sync


# --- the key's Secret ----------------------------------------------------------------------------


def writer(api: FakeApi) -> Writer:
    return Writer(api, metrics=Metrics())


async def test_an_absent_key_is_created_once_and_read_after() -> None:
    api = FakeApi()
    with structlog.testing.capture_logs() as logs:
        key = await hashkey.ensure(api, writer(api), "projector-system")
        again = await hashkey.ensure(api, writer(api), "projector-system")
    assert again == key
    stored = api.get_object(SECRETS, "projector-system", HASH_KEY_SECRET)
    assert stored is not None
    assert stored["metadata"]["labels"] == {MANAGED_BY_LABEL: "projector"}
    assert stored["immutable"] is True and stored["type"] == "Opaque"
    assert base64.b64decode(stored["data"]["key"]) == key.secret and len(key.secret) == 32
    assert [e["event"] for e in logs] == ["hash key created", "hash key read"]
    assert stored["data"]["key"] not in repr(logs) and key.secret.hex() not in repr(logs)


class Racing(FakeApi):
    """Another replica creates the key between this one's read (404) and its create."""

    async def send(self, req: Request) -> Obj:
        if req.verb == "CREATE" and req.name is None and not self.objects:
            self.add(SECRETS, {**hashkey.manifest(OTHER.secret), "metadata": THEIRS})
        return await super().send(req)


THEIRS = {"name": HASH_KEY_SECRET, "namespace": "ns", "labels": {MANAGED_BY_LABEL: "projector"}}


async def test_two_replicas_racing_use_the_one_key_created() -> None:
    api = Racing()
    with structlog.testing.capture_logs() as logs:
        key = await hashkey.ensure(api, writer(api), "ns")
    assert key == OTHER  # refused (409 AlreadyExists), it read the winner's
    assert [c[0] for c in api.calls] == ["GET", "CREATE", "GET"]
    assert [e["event"] for e in logs] == ["hash key created by another replica"]


async def test_a_failed_read_is_retried_and_logged_without_the_key() -> None:
    api = FakeApi()
    api.fail("GET", ServerError(503, "ServiceUnavailable"), ServerError(0, "Timeout"))
    with structlog.testing.capture_logs() as logs:
        key = await hashkey.ensure(api, writer(api), "ns", backoff=(0.0, 0.0))
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [w["status"] for w in warnings] == [503, 0]
    assert key.secret.hex() not in repr(logs)


async def test_a_secret_without_a_usable_key_is_fatal_and_not_replaced() -> None:
    api = FakeApi()
    api.add(
        SECRETS,
        {
            "metadata": {"name": HASH_KEY_SECRET, "namespace": "ns"},
            "data": {"key": base64.b64encode(b"too-short").decode()},
        },
    )
    with pytest.raises(ProjectorError, match="holds no usable hash key") as e:
        await hashkey.ensure(api, writer(api), "ns")
    assert "too-short" not in str(e.value)
    assert [c[0] for c in api.calls] == ["GET"]


# --- the controller: no plan without the key ----------------------------------------------------


async def test_the_controller_plans_nothing_before_it_has_the_key_then_signs_with_it() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api, config=Config(namespace="projector-system"))
    ctl.hash_key = None  # as `app` builds it: `run` reads the key first
    assert await ctl.reconcile("g") is Result.UNHEALTHY
    assert [c for c in api.calls if c[0] not in ("LIST", "WATCH")] == []
    assert await ctl._read_hash_key()
    assert ctl.hash_key is not None
    assert await ctl.reconcile("g") is Result.OK
    copy = api.get_object(SECRETS, "a", "s")
    assert copy is not None
    assert copy["metadata"]["annotations"][HASH_ANNOTATION].startswith("hmac-sha256:")


async def test_a_controller_stopped_while_the_key_cannot_be_read_gives_up() -> None:
    api = FakeApi()
    ctl = await controller(api)
    ctl.hash_key = None
    api.fail("GET", *[ServerError(503, "ServiceUnavailable")] * 1000)
    reading = asyncio.create_task(ctl._read_hash_key())
    for _ in range(5):
        await asyncio.sleep(0)  # let it try (and back off)
    ctl.stop()
    assert await reading is False and ctl.hash_key is None
