"""Settings of `projector run`, from flags with environment fallbacks (docs/cli.md)."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Timings:
    """Leader election's clock, client-go's defaults: lease 15 s, renew deadline 10 s, retry 2 s."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "need 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period:g} s, {self.renew_deadline:g} s, {self.lease_duration:g} s"
            )


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the controller is told at start; immutable once running."""

    kubeconfig: str | None = None
    """Path to a kubeconfig; None: in-cluster config, then $KUBECONFIG."""
    namespace: str = "projector-system"
    """The controller's own namespace: its leader-election Lease lives here."""
    http_port: int = 8080
    """Plain HTTP for the kubelet's probes: /healthz and /readyz; 0 picks a free one."""
    http_host: str = "0.0.0.0"
    """The address both ports listen on."""
    metrics_port: int = 8443
    """/metrics alone, on its own port; 0 picks a free one."""
    metrics_secure: bool = True
    """/metrics over HTTPS, for a bearer token that a TokenReview authenticates and a
    SubjectAccessReview allows to `get` the non-resource URL /metrics
    (`projector.telemetry.access`), as
    controller-runtime's secure metrics and kube-rbac-proxy serve it. Off: plain HTTP, anyone
    who reaches the port reads it."""
    metrics_cert_dir: str = ""
    """A directory with tls.crt and tls.key for the metrics port (a mounted kubernetes.io/tls
    Secret); empty: a self-signed certificate made in memory at start
    (`projector.telemetry.certs`)."""
    workers: int = 4
    """Grants reconciled concurrently."""
    write_concurrency: int = 32
    """Copy writes in flight at once, across all grants."""
    debounce: float = 0.05
    """Trailing window that collapses bursts of source changes into one reconcile."""
    debounce_max: float = 0.5
    """A key waits at most this long after its first change, however busy the burst."""
    debounce_hot_max: float = 8.0
    """Longest window of a hot key. A key is hot when its last window collapsed several changes
    and it changes again within a window of that run; each such window is twice the last, up to
    this, and ends after --debounce-max of quiet or at its cap. A key quiet for a whole window is
    cold again, and changes made one at a time never make a key hot: a source rewritten many
    times a second is copied every few seconds, while a lone change keeps the short debounce."""
    qps: float = 0.0
    """Client-side request rate limit; 0 (the default) disables it. Fairness is the API server's
    job: API Priority and Fairness (on in every API server since 1.29) queues each client's
    requests in its priority level, and the chart puts projector's ServiceAccount in a bounded
    level of its own (its FlowSchema). A 429 from it is honoured with its Retry-After. A client
    token bucket on top only slowed fan-outs: at 200/s after a burst of 400, a 1 -> 1,000
    fan-out took no less than 3 s (3.6 s measured, against 1.0 s without it and 1.6 s for the
    Go peer; docs/benchmarks.md). kubectl turns client-go's limit off for the same reason. Set
    it where APF is off or projector's identity is exempt from it (system:masters)."""
    burst: int = 400
    leader_elect: bool = True
    """Only the holder of the Lease writes, so two replicas can never both write by accident."""
    id: str = ""
    """This replica's identity in the Lease and in its User-Agent; default hostname (the pod)."""
    lease: Timings = field(default_factory=Timings)
    log_level: str = "info"
    informer_dead_after: float = 120.0
    """Seconds during which the API server refused every list/watch of an informer (401, 403,
    404: its RBAC or CRD gone) after which /healthz fails. An unreachable API server never
    fails /healthz: a restart could not bring it back."""
    resync_period: float = 600.0
    """Every grant is reconciled again from the caches this often (jittered by +-10%); 0 turns
    it off. It repairs what a missed event or a failed status write left stale; a grant in sync
    writes nothing, so a resync costs CPU, not API writes."""
    protected_namespaces: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
    """Namespaces never written into, whatever a grant targets (the controller's own is always
    one): a grant aiming there is told so in its status, and a copy it holds there is revoked.
    The chart's admission policy refuses the same writes (defence in depth)."""
    configmaps: bool = True
    """Serve ConfigMap grants. Off: no ConfigMap is listed or watched (the chart then grants no
    ConfigMap write), and a ConfigMap grant's source reads as unavailable."""
    rollouts: bool = False
    """Roll Deployments, StatefulSets and DaemonSets that name a copy in their
    projector.nebari.dev/rollout-on annotation when its content changes (`projector.rollout.wing`).
    Off: no workload is listed, watched or patched (and the chart grants no access to them)."""
    rollout_debounce: float = 2.0
    """Trailing window of a workload's rollout: the copy writes of one burst (seconds apart,
    see --debounce-hot-max) collapse into one rollout instead of one each."""
    rollout_debounce_max: float = 10.0
    """A workload's rollout waits at most this long after the first copy change it follows."""
    conflict_recheck: float = 60.0
    """How often a grant with conflicts looks again (the blocking object is not cached)."""
    watch_timeout: int = 300
    """Server-side timeoutSeconds of a watch (plus up to half again of jitter); it then resumes."""
    informer_stall_after: float = 180.0
    """Silence (no event, bookmark, accepted watch or list) after which an informer counts as
    stalled; exposed as projector_informer_stall_threshold_seconds for the alert. The API
    server sends a bookmark about every minute, so a healthy informer stays well below it.
    Half of it is each watch's read deadline: a connection silent that long is dropped and the
    watch resumed on a new one, so the alert fires only when reconnecting does not help. Below
    about 2 min, keep --watch-timeout under half of it, so quiet watches end before that."""

    @property
    def protected(self) -> frozenset[str]:
        """The namespaces never written into: the configured ones and the controller's own."""
        return frozenset({*self.protected_namespaces, self.namespace})


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (blanks ignored)."""
    return tuple(n for n in (part.strip() for part in text.split(",")) if n)


def _env(name: str, default: str) -> str:
    return os.environ.get(f"PROJECTOR_{name}", default)


def seconds(text: str) -> float:
    """A duration as the Kubernetes tools write it: `15s`, `500ms`, `1m`, or bare seconds."""
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * scale
    return float(text)


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag of `projector run` that sets the `Config` (or lease `Timings`) field it names.

    Its default is the field's, overridden by PROJECTOR_<FIELD> from the environment.
    """

    name: str
    type: Callable[[str], Any]
    help: str | None = None

    @property
    def field(self) -> str:
        """The field it sets: `--write-concurrency` sets `write_concurrency`."""
        return self.name.removeprefix("--").replace("-", "_")

    def add(self, parser: argparse.ArgumentParser, default: object) -> None:
        """Add it to `parser`, its default read from the environment first."""
        if isinstance(default, tuple):
            text = ",".join(default)
        else:
            text = f"{default:g}s" if self.type is seconds else str(default)
        value = self.type(_env(self.field.upper(), text))
        parser.add_argument(self.name, type=self.type, default=value, help=self.help)


_LEASE_FLAGS = (
    Flag("--lease-duration", seconds, "e.g. 15s"),
    Flag("--renew-deadline", seconds, "e.g. 15s"),
    Flag("--retry-period", seconds, "e.g. 15s"),
)

FLAGS = (
    Flag("--namespace", str),
    Flag("--http-port", int),
    Flag("--http-host", str),
    Flag("--metrics-port", int),
    Flag("--metrics-cert-dir", str, "directory holding tls.crt and tls.key for the metrics port"),
    Flag("--protected-namespaces", names, "comma-separated namespaces never written into"),
    Flag("--workers", int),
    Flag("--write-concurrency", int),
    Flag("--debounce", float, "trailing debounce window in seconds"),
    Flag("--debounce-max", float, "maximum wait of a debounced key in seconds"),
    Flag(
        "--debounce-hot-max",
        float,
        "maximum wait of a key that keeps changing (its wait doubles from --debounce-max)",
    ),
    Flag("--qps", float),
    Flag("--burst", int),
    Flag("--watch-timeout", int, "server-side timeout of one watch request in seconds"),
    Flag(
        "--informer-stall-after",
        seconds,
        "silence after which an informer counts as stalled, e.g. 3m",
    ),
    Flag(
        "--resync-period",
        seconds,
        "reconcile every grant again this often, jittered, e.g. 10m; 0 turns it off",
    ),
    Flag(
        "--rollout-debounce",
        seconds,
        "trailing window that collapses a burst of copy changes into one rollout, e.g. 2s",
    ),
    Flag(
        "--rollout-debounce-max",
        seconds,
        "longest a rollout waits after the first copy change it follows, e.g. 10s",
    ),
    Flag("--log-level", str),
    Flag(
        "--informer-dead-after",
        seconds,
        "how long the API server may refuse an informer (401/403/404) before /healthz "
        "fails, e.g. 120s (an unreachable server never fails it)",
    ),
)
"""The flags that set one `Config` field each (besides --kubeconfig, the switches, --id)."""


def parser() -> argparse.ArgumentParser:
    """The `projector run` flags, defaults from the environment, then from `Config`."""
    d = Config()
    p = argparse.ArgumentParser(prog="projector run", description="Run the projector controller.")
    p.add_argument("--kubeconfig", default=os.environ.get("PROJECTOR_KUBECONFIG") or None)
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=_env("LEADER_ELECT", "true").lower() in ("1", "true", "yes"),
    )
    p.add_argument(
        "--configmaps",
        action=argparse.BooleanOptionalAction,
        default=_env("CONFIGMAPS", "true").lower() in ("1", "true", "yes"),
        help="serve ConfigMap grants: watch exported and projected ConfigMaps (default on)",
    )
    p.add_argument(
        "--rollouts",
        action=argparse.BooleanOptionalAction,
        default=_env("ROLLOUTS", "false").lower() in ("1", "true", "yes"),
        help="roll workloads that opt in with projector.nebari.dev/rollout-on (default off)",
    )
    p.add_argument(
        "--metrics-secure",
        action=argparse.BooleanOptionalAction,
        default=_env("METRICS_SECURE", "true").lower() in ("1", "true", "yes"),
        help="serve /metrics over HTTPS to authorized bearer tokens only (default on)",
    )
    p.add_argument("--id", default=_env("ID", "") or socket.gethostname())
    for flag in FLAGS:
        flag.add(p, getattr(d, flag.field))
    for flag in _LEASE_FLAGS:
        flag.add(p, getattr(d.lease, flag.field))
    return p


def parse(argv: Sequence[str] | None = None) -> Config:
    """Parse `projector run` flags; each flag also reads PROJECTOR_<FLAG> from the environment."""
    p = parser()
    a = p.parse_args(argv)
    if a.workers < 1 or a.write_concurrency < 1:
        p.error("--workers and --write-concurrency must be at least 1")
    if not 0 <= a.debounce <= a.debounce_max <= a.debounce_hot_max:
        p.error("need 0 <= --debounce <= --debounce-max <= --debounce-hot-max")
    if a.watch_timeout < 1 or a.informer_stall_after <= 0:
        p.error("--watch-timeout and --informer-stall-after must be positive")
    if not 0 <= a.rollout_debounce <= a.rollout_debounce_max:
        p.error("need 0 <= --rollout-debounce <= --rollout-debounce-max")
    if a.resync_period < 0:
        p.error("--resync-period must be 0 (off) or positive")
    if a.metrics_port and a.metrics_port == a.http_port:
        p.error("--metrics-port and --http-port must differ")
    if not a.id:
        p.error("--id must not be empty")
    try:
        lease = Timings(*(getattr(a, f.field) for f in _LEASE_FLAGS))
    except ValueError as e:
        p.error(str(e))
    fields = {f.field: getattr(a, f.field) for f in FLAGS}
    return Config(
        kubeconfig=a.kubeconfig,
        leader_elect=a.leader_elect,
        configmaps=a.configmaps,
        rollouts=a.rollouts,
        metrics_secure=a.metrics_secure,
        id=a.id,
        lease=lease,
        **fields,
    )
