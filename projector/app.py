"""The wiring root: builds every part once, runs them together, shuts them down cleanly.

Order: the HTTP ports first (so /healthz answers during sync; the metrics port's certificate
is made while the API server is connected to), then the informers that fill the store, then,
once every cache is synced, the workers, for as long as this replica leads.
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
import ctypes
import gc
import signal
import ssl
import sys
import time
from collections.abc import Sequence
from typing import Any

import structlog
import uvloop
from aiohttp import web

from projector import config as config_mod
from projector.cache.caches import Cache
from projector.cache.exported import ExportedSources
from projector.cache.informer import Informer
from projector.cache.store import Store
from projector.client.kube import Kube
from projector.config import Config
from projector.control.controller import Controller
from projector.control.leader import Elector
from projector.control.notices import Notices
from projector.control.queue import WorkQueue
from projector.control.recorder import Recorder
from projector.control.writer import Writer
from projector.errors import ProjectorError
from projector.rollout.decide import Ref
from projector.rollout.wing import Rollouts
from projector.telemetry import certs
from projector.telemetry.access import Access
from projector.telemetry.endpoints import health_app, metrics_app
from projector.telemetry.logs import configure_logging
from projector.telemetry.metrics import Metrics
from projector.telemetry.tracing import configure_tracing, spans_exported

log = structlog.get_logger("projector")


DRAIN_SECONDS = 5.0
"""On SIGTERM, how long reconciles under way may take to finish (a replace is never cut)."""

REVIEW_QPS, REVIEW_BURST = 10.0, 20
"""The rate limit of the metrics port's token reviews, on a session of their own: a scraper
needs two a minute, and a flood of tokens costs the API server no more than this."""


async def run(
    cfg: Config, *, stop: asyncio.Event | None = None, metrics: Metrics | None = None
) -> None:
    """Run the controller until `stop` is set or a signal arrives: build, run, stop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    tls = (
        asyncio.create_task(certs.serving_context(cfg.metrics_cert_dir))
        if cfg.metrics_secure
        else None
    )
    try:
        process = await Process.build(cfg, metrics or Metrics())
    except BaseException:
        if tls is not None:
            tls.cancel()
        raise
    try:
        await process.open_port(await tls if tls is not None else None)
    except BaseException:  # a port taken, a certificate that does not load: nothing left open
        await process.close()
        raise
    task = asyncio.create_task(process.serve(), name="controller")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await process.shut_down(task, stopper)
    if task.done() and not task.cancelled() and (err := task.exception()) is not None:
        while isinstance(err, BaseExceptionGroup):  # TaskGroup wraps: report the first cause
            err = err.exceptions[0]
        raise err


class Process:
    """Every part of one controller process, built once (`build`), run (`serve`), stopped."""

    def __init__(
        self,
        cfg: Config,
        metrics: Metrics,
        kube: Kube,
        elector: Elector | None,
        lease_api: Kube | None,
        review_api: Kube | None = None,
    ) -> None:
        self.cfg, self.metrics, self.kube = cfg, metrics, kube
        self.elector, self.lease_api = elector, lease_api
        self.review_api = review_api
        """The metrics port's TokenReviews and SubjectAccessReviews (None: plain metrics)."""
        fence = elector.valid_for if elector is not None else None
        self.store = store = Store(kube, cfg.protected, configmaps=cfg.configmaps)
        self.behind = False
        """Some cache was behind the server (a failed list or watch, a relist) since the last
        time every cache was current."""
        self.informers = [self._informer(c) for c in store.caches if self._serves(c)]
        self.exported = ExportedSources(
            kube,
            store.source_changed,
            timeout_seconds=cfg.watch_timeout,
            read_deadline=cfg.informer_stall_after / 2,
        )
        store.track_exported(self.exported)
        self.queue: WorkQueue[str] = WorkQueue(
            debounce=cfg.debounce,
            debounce_max=cfg.debounce_max,
            debounce_hot_max=cfg.debounce_hot_max,
            on_event=metrics.on_queue_event,
        )
        metrics.bind_queue(self.queue)
        tracer = configure_tracing(metrics=metrics)
        writer = Writer(
            kube,
            metrics=metrics,
            tracer=tracer if spans_exported() else None,  # the reconcile's span carries trace ids
            concurrency=cfg.write_concurrency,
            fence=fence,
        )
        recorder = Recorder(writer, cfg.id)
        self.notices = Notices(recorder)
        store.watch_sources(self.notices.source_changed)
        self.rollouts: Rollouts | None = None
        if cfg.rollouts:  # off: no workload is even listed
            rollout_queue: WorkQueue[Ref] = WorkQueue(
                debounce=cfg.rollout_debounce, debounce_max=cfg.rollout_debounce_max
            )
            self.rollouts = Rollouts(
                store, writer, queue=rollout_queue, metrics=metrics, recorder=recorder
            )
            self.informers += [self._informer(c) for c in self.rollouts.caches]
        self.caches = [i.cache for i in self.informers]
        metrics.bind_informers((i.name for i in self.informers), cfg.informer_stall_after)
        self.controller = Controller(
            store,
            config=cfg,
            metrics=metrics,
            queue=self.queue,
            writer=writer,
            recorder=recorder,
            tracer=tracer,
            wings=(self.rollouts,) if self.rollouts is not None else (),
            notices=self.notices,
        )
        self.tasks: list[asyncio.Task[None]] = []
        """The tasks that run for the life of the process: if one ends, the process is wedged."""
        self.workers: list[asyncio.Task[None]] = []
        """The workers of the current leadership term (none while following)."""
        self.runner = web.AppRunner(health_app(alive=self.alive, ready=self.ready), access_log=None)
        access = Access(review_api) if review_api is not None else None
        self.metrics_runner = web.AppRunner(metrics_app(metrics, access=access), access_log=None)

    def _serves(self, cache: Cache[Any, Any]) -> bool:
        """Whether an informer fills the cache: ConfigMaps' only with --configmaps.

        Without, the cache stays empty, synced and current, and no ConfigMap is ever listed.
        """
        if self.cfg.configmaps or cache not in (
            self.store.config_sources,
            self.store.config_copies,
        ):
            return True
        cache.synced.set()
        cache.healthy.set()
        return False

    def _informer(self, cache: Cache[Any, Any]) -> Informer[Any, Any]:
        cfg, store = self.cfg, self.store
        # Sources list once the grants are known: a source no grant names is cached without its
        # data, so listing them first would make every named source a read of its own after.
        sources = cache in (store.sources, store.config_sources)
        return Informer(
            self.kube,
            cache,
            on_event=self._on_informer_event,
            timeout_seconds=cfg.watch_timeout,
            read_deadline=cfg.informer_stall_after / 2,
            after=store.grants.synced if sources else None,
        )

    @classmethod
    async def build(cls, cfg: Config, metrics: Metrics) -> Process:
        """Connect to the API server (and, electing, a second session for the Lease)."""
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
                lease_api,
                namespace=cfg.namespace,
                identity=cfg.id,
                metrics=metrics,
                timings=cfg.lease,
            )
        kube = await Kube.connect(
            cfg.kubeconfig,
            qps=cfg.qps,
            burst=cfg.burst,
            on_request=metrics.on_request,
            identity=cfg.id,
            fence=elector.valid_for if elector is not None else None,
        )
        review_api: Kube | None = None
        if cfg.metrics_secure:  # its own session and rate limit: scrapers never take the writes'
            review_api = await Kube.connect(
                cfg.kubeconfig,
                qps=REVIEW_QPS,
                burst=REVIEW_BURST,
                on_request=metrics.on_request,
                identity=cfg.id,
                timeout=5.0,
            )
        return cls(cfg, metrics, kube, elector, lease_api, review_api)

    def alive(self) -> bool:
        """Not wedged: every long-lived task runs, and every informer steps (or retries).

        The event loop answering this request is the first half. An informer that retries an
        API server that is away is alive; one the server has refused (401/403/404) for longer
        than `informer_dead_after` is not (its RBAC or CRD is gone: a restart at least says so).
        """
        now = time.monotonic()
        limit = self.cfg.informer_dead_after
        informers = self.informers
        refused = any(i.refused_since and now - i.refused_since > limit for i in informers)
        wedged = any(i.wedged() for i in informers)
        return not refused and not wedged and all(not t.done() for t in self.tasks)

    def ready(self) -> bool:
        """Every cache has synced and none is known to be behind the server right now."""
        return all(c.synced.is_set() and c.healthy.is_set() for c in self.caches)

    def _on_informer_event(self, kind: str, type_: str) -> None:
        self.metrics.on_informer_event(kind, type_)
        if type_ in ("ERROR", "RELIST"):
            self.behind = True
        if type_ in ("OPEN", "RELIST") and self.elector is not None:
            self.elector.nudge()  # the server answers again: campaign now, not at the next turn
        if type_ == "OPEN" and self.behind and self.store.healthy():
            self.behind = False
            if self.workers:  # the grants that waited on a cache run now, not when backoff ends
                self.controller.resync()

    async def open_port(self, tls: ssl.SSLContext | None = None) -> None:
        """The HTTP ports first, so /healthz answers while the caches sync.

        /metrics is served over `tls` (None: plain HTTP, `--no-metrics-secure`).
        """
        cfg = self.cfg
        await self.runner.setup()
        site = web.TCPSite(self.runner, cfg.http_host, cfg.http_port)
        await site.start()
        await self.metrics_runner.setup()
        metrics_site = web.TCPSite(
            self.metrics_runner, cfg.http_host, cfg.metrics_port, ssl_context=tls
        )
        await metrics_site.start()
        leader_elect = self.elector is not None
        log.info(
            "started",
            http=site.name,
            metrics=metrics_site.name,
            id=cfg.id,
            workers=cfg.workers,
            leader_elect=leader_elect,
        )

    async def serve(self) -> None:
        """Informers (and the elector), then, once every cache is synced, the workers."""
        elector, tasks = self.elector, self.tasks
        async with asyncio.TaskGroup() as tg:
            tasks.extend(tg.create_task(i.run(), name=f"informer-{i.name}") for i in self.informers)
            tasks.append(tg.create_task(self.exported.run(), name="exported-sources"))
            if elector is not None:
                tasks.append(tg.create_task(elector.run(), name="elector"))
            leading = elector.leading if elector is not None else None
            tasks.append(tg.create_task(self.notices.run(leading), name="notices"))
            await asyncio.gather(*(c.synced.wait() for c in self.caches))
            log.info("caches synced", **{c.spec.kind.value: len(c) for c in self.caches})
            settle_heap()
            if elector is not None:  # a hot standby until it leads: synced, ready, waiting
                tasks.append(tg.create_task(self._lead(tg, elector), name="leadership"))
            else:
                self.metrics.leading(True)
                self.controller.resync()
                self.workers.append(tg.create_task(self.controller.run(), name="workers"))
                tasks.append(self.workers[0])

    async def _lead(self, tg: asyncio.TaskGroup, elector: Elector) -> None:
        """Run workers while this replica leads; stop them, caches kept, when it stops."""
        controller, workers = self.controller, self.workers
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
            self._requeue_interrupted()
            log.info("workers stopped; caches kept warm", term=elector.terms)

    def _requeue_interrupted(self) -> None:
        """Keys whose reconcile was cancelled with its term are queued for the next one."""
        rollouts = self.rollouts
        for q in (self.queue, *((rollouts.queue,) if rollouts else ())):
            for key in list(q.processing):
                q.done(key)
                q.add_now(key)

    async def shut_down(self, task: asyncio.Task[None], stopper: asyncio.Task[bool]) -> None:
        """Drain the reconciles under way, cancel `serve`'s task, release the Lease, close all."""
        self.controller.stop()
        if self.workers and not task.done():
            await asyncio.wait(self.workers, timeout=DRAIN_SECONDS)
        for t in (task, stopper):
            t.cancel()
        for t in (task, stopper):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.elector is not None:
            await self.elector.release()
        await self.close()
        self.metrics.leading(False)
        log.info("stopped")

    async def close(self) -> None:
        """Close the ports and the API server sessions."""
        await self.runner.cleanup()
        await self.metrics_runner.cleanup()
        for api in (self.lease_api, self.review_api, self.kube):
            if api is not None:
                await api.close()


def settle_heap() -> None:
    """Collect, then move every object alive now out of the cyclic collector's reach.

    Once the caches are synced they hold most of the heap, and they live as long as the
    process (and the imported modules with them); every full collection walked all of them.
    Side by side on a loaded machine (docs/benchmarks.md, write-path-4*): 1 -> 1,000 CPU per
    write 0.86 -> 0.68 ms in one run, no clear change in another; to be confirmed on a quiet
    machine. Objects freed later by reference counting are still freed; only cyclic garbage
    among the frozen ones would stay (collected first, so none).

    Then glibc is asked to return the free pages at the top of its heaps: the initial lists'
    parse freed many megabytes that malloc otherwise keeps resident for good.
    """
    gc.collect()
    gc.freeze()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def main(argv: Sequence[str] | None = None) -> int:
    """`projector run`: exit 0 on a clean stop, 1 with a one-line reason on a fatal error."""
    cfg = config_mod.parse(argv)
    configure_logging(cfg.log_level)
    try:
        # uvloop, not asyncio's own loop: 5-8% less CPU per copy write side by side
        # (write-path-11-uvloop in docs/benchmarks.md; a first run read 12-15%), the fan-out
        # time unchanged.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(cfg))
    except (ProjectorError, OSError) as e:
        print(f"projector: fatal: {e}", file=sys.stderr)
        return 1
    return 0
