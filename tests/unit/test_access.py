"""The metrics port's gate (`projector.telemetry.access`) and TLS (`projector.telemetry.certs`),
on a double of the API server's reviews; tests/integration/test_metrics_access.py asks a real
one."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator
from pathlib import Path

import aiohttp
import pytest
import structlog
from aiohttp import web

from projector import config
from projector.client.api import Api, Request
from projector.core.kinds import Obj
from projector.errors import ServerError
from projector.telemetry import certs
from projector.telemetry.access import Access, bearer
from projector.telemetry.endpoints import metrics_app
from projector.telemetry.metrics import Metrics

READER = "system:serviceaccount:monitoring:prometheus"


class Reviews(Api):
    """Answers TokenReviews from `users` (token -> name) and SubjectAccessReviews from
    `allowed` (names); `gate`, when set, holds every review until it is set."""

    def __init__(self, users: dict[str, str], allowed: set[str]) -> None:
        self.users, self.allowed = users, allowed
        self.sent: list[Obj] = []
        self.gate: asyncio.Event | None = None
        self.error: ServerError | None = None

    async def send(self, req: Request) -> Obj:
        assert req.method == "POST" and isinstance(req.body, dict)
        self.sent.append(req.body)
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        spec = req.body["spec"]
        if req.res.kind == "TokenReview":
            name = self.users.get(spec["token"])
            status: Obj = {"authenticated": True, "user": {"username": name}} if name else {}
        else:
            status = {"allowed": True} if spec["user"] in self.allowed else {}
        return {"kind": req.res.kind, "status": status}

    def stream(self, req: Request, read_deadline: float) -> AsyncGenerator[tuple[str, Obj], None]:
        raise NotImplementedError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(
    users: dict[str, str] | None = None,
    allowed: set[str] | None = None,
    *,
    size: int = 1024,
    pending: int = 8,
) -> tuple[Access, Reviews, Clock]:
    api = Reviews(users or {}, allowed or set())
    clock = Clock()
    return Access(api, clock=clock, size=size, pending=pending), api, clock


@pytest.mark.parametrize(
    "header, token",
    [
        pytest.param(None, "", id="no header"),
        pytest.param("Basic dXNlcjpwdw==", "", id="another scheme"),
        pytest.param("Bearer ", "", id="empty token"),
        pytest.param("bearer  abc ", "abc", id="scheme in any case"),
    ],
)
def test_bearer_reads_only_a_bearer_token(header: str | None, token: str) -> None:
    assert bearer(header) == token


async def test_no_token_is_401_without_asking_the_api_server() -> None:
    access, api, _ = make()
    assert (await access.check(None)).status == 401
    assert (await access.check("Basic x")).status == 401
    assert api.sent == []


async def test_an_allowed_token_is_reviewed_once_a_minute_with_the_users_attributes() -> None:
    access, api, clock = make({"t1": READER}, {READER})
    verdict = await access.check("Bearer t1")
    assert (verdict.status, verdict.user) == (200, READER)
    token_review, access_review = api.sent
    assert token_review == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t1"},
    }
    assert access_review["kind"] == "SubjectAccessReview"
    assert access_review["spec"] == {
        "user": READER,
        "groups": [],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    clock.now = 59.0
    assert (await access.check("Bearer t1")).allowed
    assert len(api.sent) == 2  # remembered
    clock.now = 60.5
    assert (await access.check("Bearer t1")).allowed
    assert len(api.sent) == 4  # reviewed again


async def test_unknown_and_unauthorized_tokens_are_401_and_403_and_remembered_too() -> None:
    access, api, _ = make({"other": "system:serviceaccount:team:app"}, {READER})
    assert (await access.check("Bearer garbage")).status == 401
    assert (await access.check("Bearer other")).status == 403
    assert len(api.sent) == 3  # a token that does not authenticate is not access-reviewed
    assert (await access.check("Bearer garbage")).status == 401
    assert (await access.check("Bearer other")).status == 403
    assert len(api.sent) == 3


async def test_remembered_verdicts_are_bounded_least_recently_used_first() -> None:
    access, api, _ = make({f"t{i}": READER for i in range(3)}, {READER}, size=2)
    for token in ("t0", "t1", "t0", "t2"):  # t1 is the least recently used when t2 comes
        await access.check(f"Bearer {token}")
    assert len(api.sent) == 6
    await access.check("Bearer t0")
    assert len(api.sent) == 6
    await access.check("Bearer t1")
    assert len(api.sent) == 8


async def test_one_review_per_token_and_new_tokens_beyond_pending_get_429() -> None:
    access, api, _ = make({"a": READER, "b": READER, "c": READER}, {READER}, pending=2)
    api.gate = asyncio.Event()
    waiting = [asyncio.create_task(access.check(f"Bearer {t}")) for t in ("a", "a", "a", "b")]
    for _ in range(10):  # let the callers and their reviews run up to the gate
        await asyncio.sleep(0)
    assert (await access.check("Bearer c")).status == 429
    assert len(api.sent) == 2  # one TokenReview for a, one for b; none for c
    api.gate.set()
    assert [v.status for v in await asyncio.gather(*waiting)] == [200] * 4
    assert len(api.sent) == 4
    assert (await access.check("Bearer c")).status == 200


async def test_a_failed_review_is_503_not_remembered_and_no_token_is_logged() -> None:
    access, api, _ = make({"s3cret-token": READER}, {READER})
    api.error = ServerError(500, "InternalError", "etcd said no about s3cret-token")
    with structlog.testing.capture_logs() as logs:
        assert (await access.check("Bearer s3cret-token")).status == 503
        api.error = None
        assert (await access.check("Bearer s3cret-token")).status == 200
    assert [e["event"] for e in logs] == ["metrics token review failed"]
    assert logs[0]["status"] == 500 and "s3cret" not in repr(logs)


def test_a_self_signed_pair_loads_and_a_cert_dir_is_read(tmp_path: Path) -> None:
    pem = certs.self_signed(["localhost", "127.0.0.1"])
    assert isinstance(certs.context(pem=pem), ssl.SSLContext)
    key, _, rest = pem.partition(b"-----END PRIVATE KEY-----\n")
    (tmp_path / "tls.key").write_bytes(key + b"-----END PRIVATE KEY-----\n")
    (tmp_path / "tls.crt").write_bytes(rest)
    assert isinstance(certs.context(str(tmp_path)), ssl.SSLContext)
    with pytest.raises(OSError):
        certs.context(str(tmp_path / "missing"))


async def test_metrics_over_tls_need_an_allowed_token() -> None:
    """The whole port: the self-signed pair made by the child process, the gate's answers."""
    tls = await certs.serving_context("")
    api = Reviews({"reader": READER, "other": "someone"}, {READER})
    runner = web.AppRunner(metrics_app(Metrics(), access=Access(api)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    url = f"https://127.0.0.1:{port}/metrics"

    async def get(token: str | None) -> tuple[int, str, aiohttp.typedefs.LooseHeaders]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers, ssl=False) as r,
        ):
            return r.status, await r.text(), r.headers

    try:
        status, _, headers = await get(None)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert (await get("other"))[0] == 403
        status, text, _ = await get("reader")
        assert status == 200 and "projector_queue_depth" in text
        api.error = ServerError(0, "ClientConnectorError", "gone")
        status, _, headers = await get("new")
        assert status == 503 and headers["Retry-After"]
    finally:
        await runner.cleanup()


def test_metrics_flags_default_to_a_secure_port_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.parse([])
    assert (cfg.metrics_port, cfg.metrics_secure, cfg.metrics_cert_dir) == (8443, True, "")
    assert cfg.http_port == 8080
    plain = config.parse(["--no-metrics-secure", "--metrics-port=9090", "--metrics-cert-dir=/c"])
    assert (plain.metrics_port, plain.metrics_secure, plain.metrics_cert_dir) == (9090, False, "/c")
    monkeypatch.setenv("PROJECTOR_METRICS_SECURE", "false")
    assert not config.parse([]).metrics_secure
    with pytest.raises(SystemExit):
        config.parse(["--metrics-port=8080"])


async def test_an_allowed_scraper_keeps_its_access_while_the_api_server_cannot_review() -> None:
    """A control-plane outage is when the metrics matter most: within the grace (15 min after
    the verdict expired) an allowed token stays allowed; a refused or unknown one gets 503."""
    gate, api, clock = make({"t": READER, "x": "someone"}, {READER})
    assert (await gate.check("Bearer t")).status == 200
    assert (await gate.check("Bearer x")).status == 403
    api.error = ServerError(0, "ConnectionRefused")
    clock.now = 61.0  # both verdicts expired; the server does not answer
    assert (await gate.check("Bearer t")).status == 200
    assert (await gate.check("Bearer x")).status == 503
    assert (await gate.check("Bearer new")).status == 503
    clock.now = 60.0 + 900.0 + 1  # past the grace: 503 for everyone
    assert (await gate.check("Bearer t")).status == 503
    api.error = None
    assert (await gate.check("Bearer t")).status == 200  # the server answers again
