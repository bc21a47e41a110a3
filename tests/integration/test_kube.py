"""The transport against the real API server: errors answer one request and break nothing else.

Runs as projector's ServiceAccount (the shipped RBAC), so a 403 is a real RBAC refusal.
"""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from pathlib import Path

import pytest
import structlog.testing
import yaml

from projector.client.kube import Kube
from projector.core.kinds import SECRETS, Resource
from projector.core.model import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from projector.errors import ApiError, AuthenticationFailed, Conflict, Forbidden, Invalid, NotFound
from tests.support import NamespaceFactory

PODS = Resource("v1", "pods", True, "Pod")
"""Not in projector's ClusterRole: every call is a 403."""


def secret(name: str, value: str = "transport-canary", **meta: str) -> dict[str, object]:
    """A Secret projector may write: labelled as its own, or the admission policy refuses it."""
    data = {"v": base64.b64encode(value.encode()).decode()}
    metadata = {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}, **meta}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data}


async def test_errors_are_mapped_and_leave_the_session_and_a_watch_working(
    projector_kubeconfig: Path, make_namespace: NamespaceFactory
) -> None:
    ns = make_namespace()
    codes: Counter[int] = Counter()
    kube = await Kube.connect(
        str(projector_kubeconfig), on_request=lambda _v, _r, c, _s: codes.update([c])
    )
    try:
        seen: list[str] = []
        opened = asyncio.Event()

        async def follow() -> None:
            _, rv = await kube.list(SECRETS, namespace=ns)
            async for kind, obj in kube.watch(SECRETS, resource_version=rv, read_deadline=30):
                opened.set()
                if kind == "ADDED" and obj["metadata"]["namespace"] == ns:
                    seen.append(obj["metadata"]["name"])
                    if obj["metadata"]["name"] == "after":
                        return

        watch = asyncio.create_task(follow())
        await asyncio.wait_for(opened.wait(), 30)
        await kube.create(SECRETS, secret("before"), namespace=ns)
        with pytest.raises(Forbidden):
            await kube.get(PODS, "x", namespace=ns)
        with pytest.raises(NotFound):
            await kube.get(SECRETS, "missing", namespace=ns)
        with pytest.raises(Conflict) as exists:
            await kube.create(SECRETS, secret("before"), namespace=ns)
        assert exists.value.already_exists
        stale = await kube.get(SECRETS, "before", namespace=ns)
        await kube.replace(SECRETS, {**stale, "data": {"v": "eQ=="}}, namespace=ns)
        with pytest.raises(Conflict) as moved:
            await kube.replace(SECRETS, stale, namespace=ns)  # its resourceVersion is old now
        assert not moved.value.already_exists
        with pytest.raises(Invalid):
            await kube.create(SECRETS, secret("Not_A_Name"), namespace=ns)
        await kube.create(SECRETS, secret("after"), namespace=ns)  # the session still works
        await asyncio.wait_for(watch, 30)  # and the watch opened before every error still runs
        assert seen == ["before", "after"]
        assert codes[403] == 1 and codes[401] == 0  # a 403 is answered once, never re-sent
    finally:
        await kube.close()


def bad_token_kubeconfig(good: Path, bad: Path) -> Path:
    config = yaml.safe_load(good.read_text())
    config["users"][0]["user"]["token"] = "not-a-token"
    bad.write_text(yaml.safe_dump(config))
    return bad


async def test_a_401_reauthenticates_once_then_reports_it(
    projector_kubeconfig: Path, tmp_path: Path
) -> None:
    bad = bad_token_kubeconfig(projector_kubeconfig, tmp_path / "kubeconfig")
    codes: list[int] = []
    kube = await Kube.connect(str(bad), on_request=lambda _v, _r, c, _s: codes.append(c))
    try:
        with pytest.raises(ApiError) as err:
            await kube.get(SECRETS, "x", namespace="default")
        assert err.value.status == 401
        assert codes == [401, 401]  # one re-authentication (the same bad token), then the error
    finally:
        await kube.close()


async def test_a_failed_reauthentication_says_so_and_backs_off(
    projector_kubeconfig: Path, tmp_path: Path
) -> None:
    """Credentials that cannot be reloaded: not a transient error, logged, and kr8s is not
    asked again before the backoff has passed (a 401 meanwhile fails at once)."""
    bad = bad_token_kubeconfig(projector_kubeconfig, tmp_path / "kubeconfig")
    codes: list[int] = []
    kube = await Kube.connect(str(bad), on_request=lambda _v, _r, c, _s: codes.append(c))
    bad.unlink()  # the credentials are gone: reloading them fails
    try:
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(AuthenticationFailed) as first:
                await kube.get(SECRETS, "x", namespace="default")
            with pytest.raises(AuthenticationFailed) as second:
                await kube.get(SECRETS, "x", namespace="default")
        assert not first.value.transient and first.value.status == 401
        assert first.value.__cause__ is not None  # kr8s' own error, chained
        assert "next try in" in second.value.message and second.value.__cause__ is None
        assert codes == [401, 401]  # one request each, never re-sent
        failed = [e for e in logs if e["event"] == "re-authentication failed"]
        assert len(failed) == 1 and failed[0]["next_try_in"] > 0
    finally:
        await kube.close()


async def test_a_list_comes_page_by_page_and_writes_can_answer_with_metadata_only(
    projector_kubeconfig: Path, make_namespace: NamespaceFactory
) -> None:
    """`limit` and `continue` on the real server; a copy written is not sent back whole."""
    ns = make_namespace()
    kube = await Kube.connect(str(projector_kubeconfig))
    try:
        for i in range(5):
            made = await kube.create(SECRETS, secret(f"s{i}"), namespace=ns, metadata_only=True)
            assert made["metadata"]["name"] == f"s{i}" and "data" not in made
        first = await kube.get(SECRETS, "s0", namespace=ns, metadata_only=True)
        rv = first["metadata"]["resourceVersion"]
        body = secret("s0", resourceVersion=rv)
        put = await kube.replace(SECRETS, body, namespace=ns, metadata_only=False)
        assert "data" in put  # without metadata_only, the server's whole answer
        pages = [
            (sorted(o["metadata"]["name"] for o in p), rv)
            async for p, rv in kube.pages(SECRETS, namespace=ns, limit=2)
        ]
        assert [names for names, _ in pages] == [["s0", "s1"], ["s2", "s3"], ["s4"]]
        assert len({rv for _, rv in pages}) == 1  # one consistent list, read in three requests
    finally:
        await kube.close()
