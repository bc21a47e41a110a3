"""The wiring root: builds every part once, runs them together, shuts them down cleanly.

Order: HTTP port first (so /healthz answers during sync), then informers, then, once every
cache is synced and this replica may lead, the workers. SIGTERM/SIGINT cancel the task group;
the queue is shut down and the HTTP session closed, and no task is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

import structlog
from aiohttp import web

from projector import config as config_mod
from projector.config import Config
from projector.controller import Controller
from projector.errors import ProjectorError
from projector.kube import Kube
from projector.queue import WorkQueue
from projector.telemetry import Metrics, configure_logging, configure_tracing, http_app
from projector.writer import Writer

log = structlog.get_logger("projector")


class Fatal(ProjectorError):
    """A condition the controller cannot run under; the process exits non-zero."""


async def run(
    cfg: Config, *, stop: asyncio.Event | None = None, metrics: Metrics | None = None
) -> None:
    """Run the controller until `stop` is set or a signal arrives."""
    metrics = metrics or Metrics()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if cfg.leader_elect:
        raise Fatal("--leader-elect is not available yet; run one replica with --no-leader-elect")
    kube = await Kube.connect(
        cfg.kubeconfig, qps=cfg.qps, burst=cfg.burst, on_request=metrics.on_request
    )
    queue: WorkQueue[str] = WorkQueue(
        debounce=cfg.debounce, debounce_max=cfg.debounce_max, on_event=metrics.on_queue_event
    )
    writer = Writer(
        kube,
        concurrency=cfg.write_concurrency,
        on_write=lambda step, result: metrics.writes.labels(step.action.value, result).inc(),
    )
    controller = Controller(
        kube, config=cfg, metrics=metrics, queue=queue, writer=writer, tracer=configure_tracing()
    )
    runner = web.AppRunner(
        http_app(metrics, alive=lambda: True, ready=controller.synced), access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, cfg.http_host, cfg.http_port)
    await site.start()
    log.info("started", http=site.name, id=cfg.id, workers=cfg.workers)
    leading = asyncio.Event()
    leading.set()  # the seam for leader election: workers start only once this is set
    metrics.leader.set(1)
    task = asyncio.create_task(controller.run(leading), name="controller")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        queue.shut_down()
        for t in (task, stopper):
            t.cancel()
        for t in (task, stopper):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await runner.cleanup()
        await kube.close()
        metrics.leader.set(0)
        log.info("stopped")
    if task.done() and not task.cancelled() and (err := task.exception()) is not None:
        while isinstance(err, BaseExceptionGroup):  # TaskGroup wraps: report the first cause
            err = err.exceptions[0]
        raise err


def main(argv: Sequence[str] | None = None) -> int:
    """`projector run`: exit 0 on a clean stop, 1 with a one-line reason on a fatal error."""
    cfg = config_mod.parse(argv)
    configure_logging(cfg.log_level)
    try:
        asyncio.run(run(cfg))
    except (ProjectorError, OSError) as e:
        print(f"projector: fatal: {e}", file=sys.stderr)
        return 1
    return 0
