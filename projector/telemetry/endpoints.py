"""The two HTTP ports: /healthz and /readyz for the kubelet, /metrics for Prometheus.

The probes' port is plain HTTP and answers anyone (it tells only whether the process is wedged
or its caches current). /metrics has a port of its own: HTTPS, served only to a bearer token
that `projector.telemetry.access` allows (401 without one, 403 for one not allowed), or, with
`--no-metrics-secure`, plain HTTP to anyone.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from projector.telemetry.access import Access
from projector.telemetry.metrics import Metrics

_REFUSED = {
    401: ("Unauthorized\n", {"WWW-Authenticate": 'Bearer realm="projector"'}),
    403: ("Forbidden\n", {}),
    429: ("Too many tokens under review\n", {"Retry-After": "1"}),
    503: ("The API server did not review the token\n", {"Retry-After": "5"}),
}


def health_app(*, alive: Callable[[], bool], ready: Callable[[], bool]) -> web.Application:
    """Liveness and readiness (every informer synced), plain HTTP for the kubelet."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if alive() else web.Response(status=503, text="stalled\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if ready() else web.Response(status=503, text="syncing\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app(metrics: Metrics, *, access: Access | None) -> web.Application:
    """Prometheus metrics, to the requests `access` allows (None: to every request)."""

    async def metrics_handler(request: web.Request) -> web.Response:
        if access is not None:
            verdict = await access.check(request.headers.get("Authorization"))
            if not verdict.allowed:
                text, headers = _REFUSED[verdict.status]
                return web.Response(status=verdict.status, text=text, headers=headers)
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(metrics.registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    return app
