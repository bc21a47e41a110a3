"""Observability proven on a real Prometheus (built from its Go module) scraping a real controller.

The controller projects against the real API server through a TCP proxy that can stall every
connection without closing it. Prometheus scrapes it every second (OpenMetrics, so exemplars
are stored) and evaluates every second the alert rules as the chart renders them (`helm
template` of its PrometheusRule: deploy/prometheus/rules.yaml with the default values). The
test evaluates every dashboard panel query and every rule through Prometheus' HTTP API, reads
an exemplar back and finds its trace id in the controller's logs, then freezes the proxy and
waits for the stall alert to fire. Pictures for docs/observability.md are drawn from the
range queries (written into docs/ when PROJECTOR_UPDATE_DOCS=1, else into the test's tmp dir).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client

from tests import support
from tests.bed.controlplane.plane import ControlPlane
from tests.bed.helm import chart
from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import REPO, ControllerProcess
from tests.bed.observability import dashboard, pictures, rules, traces
from tests.bed.prometheus.harness import Prometheus, StallProxy, binaries
from tests.support import Canaries, Cluster, NamespaceFactory

RULE_TESTS = REPO / "tests/data/rules_test.yaml"
STALL_AFTER = 8.0
"""The controller's --informer-stall-after here; quiet watches restart every 2-3 s meanwhile."""


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    return binaries()


@pytest.fixture(scope="session")
def chart_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's PrometheusRule (`helm template`, default values) as a Prometheus rule file."""
    rendered = chart.documents(
        chart.template(
            chart.helm_binary(),
            "--set=metrics.prometheusRule.enabled=true",
            "--show-only=templates/prometheusrule.yaml",
        )
    )
    assert [d["kind"] for d in rendered] == ["PrometheusRule"]
    path = tmp_path_factory.mktemp("chart-rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered[0]["spec"]["groups"]}))
    return path


PROVOKED = ("ProjectorConflicts", "ProjectorGrantsNotReady", "ProjectorWriteErrors")
"""Alerts provoked by the scenario itself; ProjectorInformerStalled and ProjectorNoLeader are
provoked later in the test (a frozen proxy, the controller stopped)."""


def provoked_rules(chart_rules: Path, dest: Path) -> Path:
    """The chart's alerts once more, without their `for:` (15 minutes would outlast any test),
    in a group of their own: the same expressions, seen firing on the real Prometheus."""
    groups = yaml.safe_load(chart_rules.read_text())["groups"]
    alerts = [
        {k: v for k, v in r.items() if k != "for"}
        for g in groups
        for r in g["rules"]
        if "alert" in r
    ]
    dest.write_text(yaml.safe_dump({"groups": [{"name": "projector.provoked", "rules": alerts}]}))
    return dest


def test_promtool_checks_the_rules_and_their_unit_tests_pass(
    prometheus_bin: Path, chart_rules: Path, tmp_path: Path
) -> None:
    promtool = str(prometheus_bin / "promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(chart_rules)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    found = {
        r["alert"]
        for g in yaml.safe_load(chart_rules.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert found == tested, f"alerts without a promtool unit test: {found - tested}"
    # The unit tests, run against the chart's rendering of the rules.
    unit = yaml.safe_load(RULE_TESTS.read_text())
    unit["rule_files"] = [str(chart_rules)]
    tests = tmp_path / "rules_test.yaml"
    tests.write_text(yaml.safe_dump(unit, sort_keys=False))
    run = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.fixture
def stall_proxy(control_plane: ControlPlane) -> Iterator[StallProxy]:
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]["server"]
    url = urllib.parse.urlsplit(server)
    proxy = StallProxy((url.hostname or "127.0.0.1", url.port or 443))
    yield proxy
    proxy.close()


@pytest.fixture
def projector_kubeconfig(
    projector_kubeconfig: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> Path:
    """The shipped-RBAC kubeconfig, pointed at the stall proxy for the tests that ask for it."""
    if "stall_proxy" not in request.fixturenames:
        return projector_kubeconfig
    proxy: StallProxy = request.getfixturevalue("stall_proxy")
    cfg = yaml.safe_load(projector_kubeconfig.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    dest = tmp_path / "proxied-kubeconfig"
    dest.write_text(yaml.safe_dump(cfg))
    return dest


def _expr(q: str) -> str:
    return q.replace("$job", "projector").replace("$__rate_interval", "1m")


def _value(series: list[dict[str, Any]]) -> str:
    """One series: its value; several: how many, and the largest with its labels."""
    if not series:
        return ""
    if len(series) == 1:
        return f"{float(series[0]['value'][1]):.4g}"
    top = max(series, key=lambda s: float(s["value"][1]))
    labels = ",".join(f"{k}={v}" for k, v in sorted(top["metric"].items()) if k != "instance")
    return f"{len(series)} series, max {float(top['value'][1]):.4g} ({labels})"


def _labels(alerts: list[dict[str, Any]]) -> str:
    """What fired, by the labels that route it."""
    keep = ("grant", "reason", "kind", "severity")
    return "; ".join(
        ",".join(f"{k}={a['labels'][k]}" for k in keep if k in a["labels"]) for a in alerts
    )


def _json_lines(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        if line.startswith("{"):
            yield json.loads(line)


def _scan(canaries: Canaries, where: str, obj: Any) -> None:
    canaries.assert_absent(where, json.dumps(obj))


def test_every_panel_and_alert_has_data_exemplars_link_traces_and_a_stall_fires(
    stall_proxy: StallProxy,
    prometheus_bin: Path,
    chart_rules: Path,
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    canaries: Canaries,
    tmp_path: Path,
) -> None:
    ctl: ControllerProcess = start_controller(
        "--watch-timeout=2", f"--informer-stall-after={STALL_AFTER:g}s"
    )
    provoked = provoked_rules(chart_rules, tmp_path / "provoked.yaml")
    prom = Prometheus(
        prometheus_bin,
        tmp_path / "prom",
        [f"127.0.0.1:{ctl.metrics_port}"],
        [chart_rules, provoked],
        token=ctl.metrics_token,
    )
    try:
        # Prometheus scrapes the controller before anything happens, so rates see every change:
        # over HTTPS, with the token of a ServiceAccount bound to the chart's metrics-reader.
        eventually(
            lambda: prom.query('up{job="projector"} == 1'), timeout=30, message="first scrape"
        )
        (target,) = prom.api("targets")["activeTargets"]
        assert target["scrapeUrl"].startswith("https://") and ctl.metrics_token
        t0 = time.time()
        # A fan-out with a conflict and a denied namespace, then two source changes.
        src, theirs, denied, full = (make_namespace() for _ in range(4))
        targets = [make_namespace() for _ in range(4)]
        k8s.source(theirs, "hub", {"k": "CANARY-foreign-obs"}, exported=False)
        # A namespace whose quota refuses any Secret: every write there fails (write errors).
        k8s.core.create_namespaced_resource_quota(
            full,
            client.V1ResourceQuota(
                metadata=client.V1ObjectMeta(name="no-secrets"),
                spec=client.V1ResourceQuotaSpec(hard={"secrets": "0"}),
            ),
        )
        eventually(
            lambda: k8s.core.read_namespaced_resource_quota("no-secrets", full).status.hard or {}
        )
        allowed = ",".join([*targets, theirs, full])
        k8s.source(src, "hub", {"token": "CANARY-obs-1"}, export_to=allowed)
        k8s.grant((src, "hub"), namespaces=[*targets, theirs, denied, full])

        def projected(value: str) -> bool:
            return all(k8s.copy_data(ns, "hub") == {"token": value} for ns in targets)

        for before, value in (("CANARY-obs-1", "CANARY-obs-2"), ("CANARY-obs-2", "CANARY-obs-3")):
            eventually(lambda before=before: projected(before), timeout=30)  # type: ignore[misc]
            k8s.patch_secret(src, "hub", {"data": {"token": value}})
        eventually(lambda: projected("CANARY-obs-3"), timeout=30)

        # Prometheus has scraped the writes (the fan-out's last sample included).
        eventually(
            lambda: (
                float(_value(prom.query("sum(projector_fanout_latency_seconds_count)")) or 0) >= 3
            ),
            timeout=30,
            message="three fan-outs scraped",
        )
        eventually(
            lambda: (
                float(
                    _value(prom.query('sum(projector_projections{state=~"Conflict|Denied"})')) or 0
                )
                >= 2
            ),
            timeout=30,
            message="the conflict and the denied namespace scraped",
        )
        values: list[tuple[str, str, str]] = []

        # Every dashboard panel query returns data; quantiles are numbers.
        for panel in dashboard.PANELS:
            for q in panel.queries:
                expr = _expr(q.expr)
                result = eventually(
                    functools.partial(prom.query, expr),
                    timeout=15,
                    message=f"panel {panel.title!r}: {expr}",
                )
                _scan(canaries, "prometheus query results", result)
                if "histogram_quantile" in expr:
                    assert not math.isnan(float(result[0]["value"][1])), (panel.title, expr)
                values.append((f"panel: {panel.title}", q.expr, _value(result)))

        # Every rule evaluates without error, on Prometheus' own rule manager.
        def rules_evaluated() -> list[dict[str, Any]]:
            groups = prom.api("rules")["groups"]
            evaluated = [r for g in groups for r in g["rules"]]
            assert len(evaluated) == len(rules.RECORDS) + 2 * len(rules.ALERTS)
            assert all(r["health"] == "ok" and not r.get("lastError") for r in evaluated), evaluated
            return evaluated

        eventually(rules_evaluated, timeout=15, message="every rule evaluated healthy")
        for record, expr in rules.RECORDS:  # each recorded series has data
            expr = expr.replace(rules.JOB_TOKEN, rules.JOB)
            result = eventually(
                functools.partial(prom.query, record), timeout=15, message=f"record {record}"
            )
            values.append((f"record: {record}", expr, _value(result)))
        for alert in rules.ALERTS:
            expr = alert.expr.replace(rules.JOB_TOKEN, rules.JOB)
            result = prom.query(expr)  # raises on a query error
            values.append((f"alert: {alert.name}", expr, _value(result)))
        assert not prom.firing("ProjectorInformerStalled"), "healthy informers counted as stalled"
        for name in PROVOKED:  # the scenario's conflict, unready grant and refused writes
            fired = eventually(
                functools.partial(prom.firing, name), timeout=30, message=f"{name} fires"
            )
            _scan(canaries, "alerts", fired)
            values.append((f"alert fired: {name}", "provoked by the scenario", _labels(fired)))

        # Exemplars: stored by Prometheus, each a trace id the controller logged a reconcile under.
        now = time.time()
        exemplars = prom.api(
            "query_exemplars",
            query="projector_projection_latency_seconds_bucket",
            start=t0 - 60,
            end=now + 5,
        )
        ids = {e["labels"]["trace_id"] for s in exemplars for e in s["exemplars"]}
        assert ids and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), exemplars
        logged = {
            line.get("trace_id")
            for line in _json_lines(ctl.logs())
            if line.get("event") == "reconciled"
        }
        assert ids & logged, f"no exemplar trace id was logged by a reconcile: {ids}"

        # A deliberately stalled informer makes the stall alert fire.
        stalled_at = time.time()
        stall_proxy.freeze()
        try:
            fired = eventually(
                lambda: prom.firing("ProjectorInformerStalled"),
                timeout=STALL_AFTER + 25,
                message="ProjectorInformerStalled fires",
            )
            kinds = sorted({a["labels"]["kind"] for a in fired})  # once per rule group
            values.append(
                (
                    "alert fired after the freeze",
                    "ProjectorInformerStalled",
                    f"firing for {', '.join(kinds)} after {time.time() - stalled_at:.0f}s",
                )
            )
        finally:
            stall_proxy.thaw()
        eventually(
            lambda: not prom.firing("ProjectorInformerStalled"),
            timeout=STALL_AFTER + 25,
            message="the stall alert resolves once the proxy flows again",
        )
        # No Secret value on the OpenMetrics page either, exemplars and all, nor on the text
        # page (scanned here: the fixture cannot once the controller is stopped below).
        canaries.assert_absent("metrics", ctl.get("/metrics")[1])
        status, page = ctl.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert status == 200 and "# {trace_id=" in page
        canaries.assert_absent("OpenMetrics page", page)

        # The controller stops: its leader series goes stale, and NoLeader fires.
        assert ctl.stop() == 0
        fired = eventually(
            lambda: prom.firing("ProjectorNoLeader"), timeout=30, message="NoLeader fires"
        )
        values.append(("alert fired: ProjectorNoLeader", "the controller stopped", _labels(fired)))

        # The page: the values above, and the pictures the long scenario below draws.
        update = os.environ.get("PROJECTOR_UPDATE_DOCS") == "1"
        docs = REPO / "docs" if update else tmp_path / "docs"
        docs.mkdir(parents=True, exist_ok=True)
        images = [(title, pictures.image(title)) for title in pictures.MAIN]
        drawn = pictures.page(images, values)  # keeping test_tracing's section of the page
        kept = traces.keep(drawn, (REPO / "docs" / "observability.md").read_text())
        (docs / "observability.md").write_text(kept)
        print("\n".join(f"{w} | {e} | {v}" for w, e, v in values))

    finally:
        prom.stop()


# --- the long scenario the pictures are drawn from (make observability-docs) -------------------

SCRAPE = 2.0
"""Prometheus scrapes and evaluates every 2 s; Grafana's `$__rate_interval` is then 4 scrapes."""
RATE_WINDOW = f"{4 * SCRAPE:g}s"
ROTATE_EVERY = 3.0
"""The steady source is rotated this often, all through the scenario."""
STEADY_TARGETS = 10
BURST_GRANTS, BURST_TARGETS = 40, 5
"""The burst: this many grants created at once, each to this many namespaces."""
HOLD = 30.0
"""Seconds of steady rotations between events, so each shows against a quiet line."""
OUTAGE = 20.0


class Rotator:
    """Rotates one source every ROTATE_EVERY seconds on a thread: the steady load a real cluster
    sees. A rotation the API server refuses (the outage) is counted and the next one tried."""

    def __init__(self, k8s: Cluster, namespace: str, name: str) -> None:
        self.k8s, self.namespace, self.name = k8s, namespace, name
        self.sent = self.refused = 0
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(ROTATE_EVERY):  # a pace, not a wait for a condition
            value = f"CANARY-steady-{self.sent + self.refused}"
            try:
                self.k8s.patch_secret(self.namespace, self.name, {"data": {"token": value}})
            except (client.ApiException, OSError, urllib3.exceptions.HTTPError):
                self.refused += 1
                continue
            self.sent += 1
            self.last = value

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.mark.long
def test_the_dashboard_pictures_from_a_long_scenario(
    prometheus_bin: Path,
    chart_rules: Path,
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    control_plane: ControlPlane,
    canaries: Canaries,
    tmp_path: Path,
) -> None:
    """Several minutes scraped every 2 s: steady rotations throughout, a burst, a conflict and
    its resolution, an API server outage mid fan-out and its recovery. Each main panel is drawn
    with the events marked, and shows the event it exists for (asserted on its range query)."""
    # Quiet watches restart every 10-15 s, so the freshness panel's quiet level stays low and
    # the outage stands out of it, under a stall threshold of a minute.
    ctl: ControllerProcess = start_controller("--watch-timeout=10", "--informer-stall-after=60s")
    prom = Prometheus(
        prometheus_bin,
        tmp_path / "prom",
        [f"127.0.0.1:{ctl.metrics_port}"],
        [chart_rules],
        interval=SCRAPE,
        token=ctl.metrics_token,
    )
    events: list[pictures.Event] = []
    rotator: Rotator | None = None
    try:
        eventually(
            lambda: prom.query('up{job="projector"} == 1'), timeout=30, message="first scrape"
        )
        team = unique_name("steady")
        src = make_namespace()
        steady = [make_namespace(labels={"obs-team": team}) for _ in range(STEADY_TARGETS)]
        burst = [make_namespace() for _ in range(BURST_TARGETS)]
        k8s.source(src, "steady", {"token": "CANARY-steady-start"}, export_to="*")
        for i in range(BURST_GRANTS):
            k8s.source(src, f"burst-{i}", {"token": "CANARY-burst-0"}, export_to="*")
        k8s.grant((src, "steady"), selector={"matchLabels": {"obs-team": team}})

        def steady_holds() -> bool:
            want = rotator.last if rotator and rotator.last else "CANARY-steady-start"
            return all(k8s.copy_data(ns, "steady") == {"token": want} for ns in steady)

        def burst_holds(value: str) -> bool:
            return all(
                k8s.copy_data(ns, f"burst-{i}") == {"token": value}
                for ns in burst
                for i in range(BURST_GRANTS)
            )

        def alive() -> bool:
            return ctl.proc.poll() is None

        eventually(steady_holds, timeout=60)
        t0 = time.time()
        rotator = Rotator(k8s, src, "steady")
        support.consistently(alive, duration=HOLD)

        # A burst: BURST_GRANTS grants at once (creates), then all their sources rotated (updates).
        at = time.time() - t0
        for i in range(BURST_GRANTS):
            k8s.grant((src, f"burst-{i}"), namespaces=burst)
        eventually(lambda: burst_holds("CANARY-burst-0"), timeout=120, interval=0.5)
        for i in range(BURST_GRANTS):
            k8s.patch_secret(src, f"burst-{i}", {"data": {"token": "CANARY-burst-1"}})
        eventually(lambda: burst_holds("CANARY-burst-1"), timeout=120, interval=0.5)
        events.append(pictures.Event(at, at, "burst"))
        support.consistently(alive, duration=HOLD)

        # A conflict: a namespace the steady grant selects already holds a Secret of that name.
        at = time.time() - t0
        clash = make_namespace()
        k8s.core.create_namespaced_secret(
            clash,
            client.V1Secret(metadata=client.V1ObjectMeta(name="steady"), string_data={"k": "x"}),
        )
        k8s.core.patch_namespace(clash, {"metadata": {"labels": {"obs-team": team}}})
        support.consistently(alive, duration=HOLD)
        k8s.core.delete_namespaced_secret("steady", clash)  # resolved: the copy can be written
        steady.append(clash)
        eventually(steady_holds, timeout=60)
        events.append(pictures.Event(at, time.time() - t0, "conflict"))
        support.consistently(alive, duration=HOLD)

        # An outage mid fan-out: the burst's sources rotated, then the API server stopped.
        for i in range(BURST_GRANTS):
            k8s.patch_secret(src, f"burst-{i}", {"data": {"token": "CANARY-burst-2"}})
        at = time.time() - t0
        with control_plane.apiserver_down():
            support.consistently(alive, duration=OUTAGE)
        events.append(pictures.Event(at, time.time() - t0, "API server down"))
        eventually(lambda: burst_holds("CANARY-burst-2"), timeout=120, interval=0.5)
        eventually(steady_holds, timeout=60)
        support.consistently(alive, duration=HOLD)
        rotator.stop()
        end = time.time()
        assert rotator.sent >= (end - t0 - OUTAGE) / ROTATE_EVERY / 2, "the rotations stalled"

        # Prometheus has the last scrape; then every main panel over the whole scenario.
        eventually(lambda: prom.query(f"timestamp(up) > {end}"), timeout=30, message="last scrape")
        update = os.environ.get("PROJECTOR_UPDATE_DOCS") == "1"
        docs = REPO / "docs" if update else tmp_path / "docs"
        shown: dict[str, list[tuple[str, Any]]] = {}
        for panel in dashboard.PANELS:
            if panel.title not in pictures.MAIN:
                continue
            series = []
            for q in panel.queries:
                expr = q.expr.replace("$job", "projector").replace("$__rate_interval", RATE_WINDOW)
                matrix = prom.query_range(expr, t0, end, SCRAPE)
                _scan(canaries, "prometheus range results", matrix)
                series.append((q.legend, matrix))
            shown[panel.title] = series
            out = docs / pictures.image(panel.title)
            pictures.draw(
                panel.title,
                panel.unit,
                series,
                out,
                heatmap=panel.heatmap,
                t0=t0,
                step=SCRAPE,
                events=events,
            )
            assert out.stat().st_size > 1000
    finally:
        if rotator is not None:
            rotator.stop()
        prom.stop()
    _each_panel_shows_its_event(shown, {e.label: e for e in events}, t0)


def _peak(
    series: list[tuple[str, Any]], start: float, end: float, t0: float, **labels: str
) -> float:
    """The largest value any of the panel's series took between start and end (scenario s)."""
    top = 0.0
    for _, matrix in series:
        for s in matrix:
            if any(s["metric"].get(k) != v for k, v in labels.items()):
                continue
            for t, v in s["values"]:
                if start <= float(t) - t0 <= end and v != "NaN":
                    top = max(top, float(v))
    return top


def _each_panel_shows_its_event(
    shown: dict[str, list[tuple[str, Any]]], events: dict[str, pictures.Event], t0: float
) -> None:
    """What each picture is for, read back from its data: the event stands out of the quiet."""
    burst, conflict, down = events["burst"], events["conflict"], events["API server down"]
    quiet = (0.0, burst.start)  # steady rotations only
    rate = shown["Projections per second"]
    assert _peak(rate, burst.start, burst.start + 30, t0) > 3 * _peak(rate, *quiet, t0)
    assert _peak(rate, *quiet, t0) > 0, "the steady rotations drew nothing"
    queue = shown["Queue depth"]
    assert _peak(queue, burst.start, burst.start + 30, t0) > _peak(queue, *quiet, t0)
    clash = shown["Conflicts and denied namespaces"]
    assert _peak(clash, conflict.start + 5, conflict.end - 5, t0, state="Conflict") >= 1
    assert _peak(clash, conflict.end + 10, down.start, t0, state="Conflict") == 0
    writes = shown["Writes by action and result"]
    assert _peak(writes, burst.start, burst.start + 30, t0, action="Create") > 0
    assert _peak(writes, down.start, down.end, t0, result="error") > 0
    fresh = shown["Informer freshness (seconds since the server was last heard)"][:1]  # by kind
    assert _peak(fresh, down.end - 4, down.end, t0) > _peak(fresh, *quiet, t0) + 5
    late = shown["Projection latency (change observed -> copy written)"]
    assert _peak(late, down.end, down.end + 30, t0) > _peak(late, *quiet, t0)
