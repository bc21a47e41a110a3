"""The wiring root: builds every part once, runs them together, shuts them down cleanly.

Order: HTTP port first (so /healthz answers during sync), then the informers that fill the
store, then, once every cache is synced, the workers. SIGTERM/SIGINT stop it: the queue is shut
down, the tasks cancelled and the HTTP session closed, and no task is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Sequence

import structlog
from aiohttp import web

from projector import config as config_mod
from projector.config import Config
from projector.controller import Controller
from projector.errors import ProjectorError
from projector.informer import Informer
from projector.kube import Kube
from projector.leader import Elector
from projector.queue import WorkQueue
from projector.recorder import Recorder
from projector.store import Store
from projector.telemetry import (
    Metrics,
    configure_logging,
    configure_tracing,
    http_app,
    spans_exported,
)
from projector.writer import Writer

log = structlog.get_logger("projector")


DRAIN_SECONDS = 5.0
"""On SIGTERM, how long reconciles under way may take to finish (a replace is never cut)."""


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
    elector: Elector | None = None
    lease_api: Kube | None = None
    if cfg.leader_elect:  # its own session, outside the write rate limit: renewals never queue
        lease_api = await Kube.connect(
            cfg.kubeconfig, on_request=metrics.on_request, identity=cfg.id
        )
        elector = Elector(
            lease_api, namespace=cfg.namespace, identity=cfg.id, metrics=metrics, timings=cfg.lease
        )
    fence = elector.valid_for if elector is not None else None
    kube = await Kube.connect(
        cfg.kubeconfig,
        qps=cfg.qps,
        burst=cfg.burst,
        on_request=metrics.on_request,
        identity=cfg.id,
        fence=fence,
    )
    store = Store(kube)
    informers = [
        Informer(
            kube,
            c,
            on_event=metrics.on_informer_event,
            timeout_seconds=cfg.watch_timeout,
            read_deadline=cfg.informer_stall_after / 2,
        )
        for c in store.caches
    ]
    metrics.bind_informers((i.name for i in informers), cfg.informer_stall_after)
    queue: WorkQueue[str] = WorkQueue(
        debounce=cfg.debounce,
        debounce_max=cfg.debounce_max,
        debounce_hot_max=cfg.debounce_hot_max,
        on_event=metrics.on_queue_event,
    )
    metrics.bind_queue(queue)
    tracer = configure_tracing(metrics=metrics)
    writer = Writer(
        kube,
        metrics=metrics,
        tracer=tracer if spans_exported() else None,  # the reconcile's span carries trace ids
        concurrency=cfg.write_concurrency,
        fence=fence,
    )
    controller = Controller(
        store,
        config=cfg,
        metrics=metrics,
        queue=queue,
        writer=writer,
        recorder=Recorder(writer, cfg.id),
        tracer=tracer,
    )
    tasks: list[asyncio.Task[None]] = []

    def alive() -> bool:
        """Every task runs, and no informer has failed longer than `informer_dead_after`.

        Such an informer's RBAC or CRD is gone for good; a blocked event loop cannot answer.
        """
        now = time.monotonic()
        limit = cfg.informer_dead_after
        dead = any(i.failing_since and now - i.failing_since > limit for i in informers)
        return not dead and all(not t.done() for t in tasks)

    def ready() -> bool:
        """Every cache has synced and none is known to be behind the server right now."""
        return store.synced() and store.healthy()

    runner = web.AppRunner(http_app(metrics, alive=alive, ready=ready), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.http_host, cfg.http_port)
    await site.start()
    log.info("started", http=site.name, id=cfg.id, workers=cfg.workers, leader_elect=bool(elector))
    workers: list[asyncio.Task[None]] = []

    async def serve() -> None:
        async with asyncio.TaskGroup() as tg:
            tasks.extend(tg.create_task(i.run(), name=f"informer-{i.name}") for i in informers)
            if elector is not None:
                tasks.append(tg.create_task(elector.run(), name="elector"))
            await asyncio.gather(*(c.synced.wait() for c in store.caches))
            log.info("caches synced", **{c.spec.kind.value: len(c) for c in store.caches})
            if elector is not None:
                await elector.leading.wait()  # a hot standby: synced, ready, and waiting
            else:
                metrics.leading(True)
            controller.resync()
            workers.append(tg.create_task(controller.run(), name="workers"))
            tasks.append(workers[0])

    task = asyncio.create_task(serve(), name="controller")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        controller.stop()
        if workers and not task.done():
            await asyncio.wait(workers, timeout=DRAIN_SECONDS)
        for t in (task, stopper):
            t.cancel()
        for t in (task, stopper):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if elector is not None:
            await elector.release()
        if lease_api is not None:
            await lease_api.close()
        await runner.cleanup()
        await kube.close()
        metrics.leading(False)
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
