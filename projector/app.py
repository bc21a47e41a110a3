"""The wiring root: builds every part once, runs them together, shuts them down cleanly.

Order: HTTP port first (so /healthz answers during sync), then the informers that fill the
store, then, once every cache is synced, the workers, for as long as this replica leads.
SIGTERM/SIGINT stop it: the queue is shut down, the tasks cancelled and the HTTP session
closed, and no task is left behind.

An API server that goes away ends nothing: the informers retry (their caches kept, marked
behind, so nothing is deleted), the elector's lease runs out (the fence closes at once), the
workers of that term are cancelled, and the replica campaigns again; on winning it queues every
grant, reconciled from the warm caches. `/healthz` says whether this process is wedged (its
event loop answers, every informer, the elector and the leadership loop run and step), never
whether the API server answers; `/readyz` says whether every cache is current.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import structlog
from aiohttp import web

from projector import config as config_mod
from projector.config import Config
from projector.controller import Controller
from projector.endpoints import http_app
from projector.errors import ProjectorError
from projector.informer import Informer
from projector.kube import Kube
from projector.leader import Elector
from projector.logs import configure_logging
from projector.metrics import Metrics
from projector.queue import WorkQueue
from projector.recorder import Recorder
from projector.rollout import Ref, Rollouts
from projector.store import Cache, Store
from projector.tracing import configure_tracing, spans_exported
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
        bound = cfg.lease.retry_period * 0.75  # no lease request outlives its turn
        lease_api = await Kube.connect(
            cfg.kubeconfig,
            on_request=metrics.on_request,
            identity=cfg.id,
            timeout=bound,
            connect_timeout=bound / 2,
            read_timeout=bound,
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

    behind = [False]
    """Some cache was behind the server (a failed list or watch, a relist) since the last time
    every cache was current."""

    def on_informer_event(kind: str, type_: str) -> None:
        metrics.on_informer_event(kind, type_)
        if type_ in ("ERROR", "RELIST"):
            behind[0] = True
        if type_ in ("OPEN", "RELIST") and elector is not None:
            elector.nudge()  # the server answers again: campaign now, not at the next turn
        if type_ == "OPEN" and behind[0] and store.healthy():
            behind[0] = False
            if workers:  # the grants that waited on a cache run now, not when their backoff ends
                controller.resync()

    def informer(c: Cache[Any, Any]) -> Informer[Any, Any]:
        return Informer(
            kube,
            c,
            on_event=on_informer_event,
            timeout_seconds=cfg.watch_timeout,
            read_deadline=cfg.informer_stall_after / 2,
        )

    informers = [informer(c) for c in store.caches]
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
    rollouts = None
    if cfg.rollouts:  # off: no workload is even listed
        rollout_queue: WorkQueue[Ref] = WorkQueue(
            debounce=cfg.rollout_debounce, debounce_max=cfg.rollout_debounce_max
        )
        rollouts = Rollouts(store, writer, queue=rollout_queue, metrics=metrics, instance=cfg.id)
        informers += [informer(c) for c in rollouts.caches]
    caches = [i.cache for i in informers]
    metrics.bind_informers((i.name for i in informers), cfg.informer_stall_after)
    controller = Controller(
        store,
        config=cfg,
        metrics=metrics,
        queue=queue,
        writer=writer,
        recorder=Recorder(writer, cfg.id),
        tracer=tracer,
        rollouts=rollouts,
    )
    tasks: list[asyncio.Task[None]] = []
    """The tasks that run for the life of the process: if one ends, the process is wedged."""

    def alive() -> bool:
        """Not wedged: every long-lived task runs, and every informer steps (or retries).

        The event loop answering this request is the first half. An informer that retries an
        API server that is away is alive; one the server has refused (401/403/404) for longer
        than `informer_dead_after` is not (its RBAC or CRD is gone: a restart at least says so).
        """
        now = time.monotonic()
        limit = cfg.informer_dead_after
        refused = any(i.refused_since and now - i.refused_since > limit for i in informers)
        wedged = any(i.wedged() for i in informers)
        return not refused and not wedged and all(not t.done() for t in tasks)

    def ready() -> bool:
        """Every cache has synced and none is known to be behind the server right now."""
        return all(c.synced.is_set() and c.healthy.is_set() for c in caches)

    runner = web.AppRunner(http_app(metrics, alive=alive, ready=ready), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.http_host, cfg.http_port)
    await site.start()
    log.info("started", http=site.name, id=cfg.id, workers=cfg.workers, leader_elect=bool(elector))
    workers: list[asyncio.Task[None]] = []
    """The workers of the current leadership term (none while following)."""

    def requeue_interrupted() -> None:
        """Keys whose reconcile was cancelled with its term are queued for the next one."""
        for q in (queue, *((rollouts.queue,) if rollouts else ())):
            for key in list(q.processing):
                q.done(key)
                q.add_now(key)

    async def lead(tg: asyncio.TaskGroup, elector: Elector) -> None:
        """Run workers while this replica leads; stop them, caches kept, when it stops."""
        while True:
            await elector.leading.wait()
            controller.resync()  # every grant, from the warm caches
            term = tg.create_task(controller.run(), name=f"workers-{elector.terms}")
            workers[:] = [term]
            following = asyncio.create_task(elector.following.wait())
            try:
                await asyncio.wait({term, following}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                following.cancel()
            if term.done():
                return  # stopped (controller.stop()), or crashed: the TaskGroup reports it
            term.cancel()  # its writes are already refused by the fence
            with contextlib.suppress(asyncio.CancelledError):
                await term
            workers.clear()
            requeue_interrupted()
            log.info("workers stopped; caches kept warm", term=elector.terms)

    async def serve() -> None:
        async with asyncio.TaskGroup() as tg:
            tasks.extend(tg.create_task(i.run(), name=f"informer-{i.name}") for i in informers)
            if elector is not None:
                tasks.append(tg.create_task(elector.run(), name="elector"))
            await asyncio.gather(*(c.synced.wait() for c in caches))
            log.info("caches synced", **{c.spec.kind.value: len(c) for c in caches})
            if elector is not None:  # a hot standby until it leads: synced, ready, waiting
                tasks.append(tg.create_task(lead(tg, elector), name="leadership"))
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
