"""The one HTTP port: /metrics for Prometheus, /healthz for liveness, /readyz for readiness."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from projector.metrics import Metrics


def http_app(
    metrics: Metrics, *, alive: Callable[[], bool], ready: Callable[[], bool]
) -> web.Application:
    """The one HTTP port: liveness, readiness (every informer synced) and Prometheus metrics."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if alive() else web.Response(status=503, text="stalled\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if ready() else web.Response(status=503, text="syncing\n")

    async def metrics_handler(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(metrics.registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app
