"""The traces section of ``docs/observability.md``: from a slow point to its reconcile and logs.

Written by ``tests/integration/test_tracing.py`` from what a real OpenTelemetry Collector received
(with ``PROJECTOR_UPDATE_DOCS=1``); the rest of the page is drawn by
``tests/integration/test_observability.py``, which keeps this section when it redraws (`keep`).
It is the last section of the page.
"""

from __future__ import annotations

import json
from pathlib import Path

HEADING = "## Traces: from a slow point to its reconcile and log lines"


def section(*, tree: str, exemplar: str, log_line: str) -> str:
    """The Markdown of the section, around the artefacts of one real fan-out."""
    return "\n".join(
        [
            HEADING,
            "",
            "Written by `tests/integration/test_tracing.py` from what a real OpenTelemetry",
            "Collector (built from Go modules, `tests/bed/otel/`) received from `projector run`",
            "over OTLP/HTTP during one fan-out to four namespaces against the real API server,",
            "one of which refuses Secrets (a ResourceQuota of `secrets: 0`). Regenerate with",
            "`make traces-docs`.",
            "",
            "**1. A slow point has an exemplar.** Scraped in OpenMetrics (`Accept:",
            "application/openmetrics-text`), each latency bucket carries the trace id of the",
            "reconcile that last fell into it; Grafana shows it as a dot on the latency panel",
            "(Prometheus needs `--enable-feature=exemplar-storage`):",
            "",
            "```",
            exemplar,
            "```",
            "",
            "**2. The trace id opens the reconcile's trace** in the tracing backend: one",
            "`reconcile` span (the grant), one `write` child per copy (grant, namespace, action,",
            "result) and one `write_status`. The refused copy's span has status ERROR with the",
            "API server's words, and so has the reconcile, which is retried with backoff. Span",
            "ids in brackets; the resource carries `service.name=projector` and",
            "`service.version`. Names and codes only: no Secret value is ever an attribute.",
            "",
            "```",
            tree,
            "```",
            "",
            "**3. The same trace id is in every log line of that reconcile** (`trace_id`, with",
            "`grant` and `reconcile_id`), so one search finds what the controller said:",
            "",
            "```json",
            log_line,
            "```",
            "",
            "### Turning it on (chart values)",
            "",
            "```yaml",
            "tracing:",
            "  otlpEndpoint: http://otel-collector.observability:4318  # OTLP/HTTP; empty: off",
            "  sampler: parentbased_traceidratio                       # OTEL_TRACES_SAMPLER",
            "  samplerRatio: 0.1                                       # traces 1 reconcile in 10",
            "```",
            "",
            "Without an endpoint no span leaves the pod and per-write spans are not even made;",
            "log lines and exemplars still carry trace ids. An unsampled reconcile has no trace",
            "id in its logs or exemplars, since there is no trace to open. The other",
            "`OTEL_EXPORTER_OTLP_*` variables (headers, timeout, TLS) go in `controller.extraEnv`.",
            "",
            "### Export never holds the controller up",
            "",
            "Spans leave in batches from a thread of their own (`OTEL_BSP_SCHEDULE_DELAY`, 5 s;",
            "512 per batch), so the event loop never waits on the receiver. At most 2048 wait",
            "(`OTEL_BSP_MAX_QUEUE_SIZE`): each further span pushes out the oldest, counted as",
            '`projector_spans_dropped_total{reason="queue_full"}`. A batch the receiver refused',
            "or never answered within `OTEL_EXPORTER_OTLP_TIMEOUT` (10 s) counts as",
            '`reason="export_failed"`, and pauses exporting for 1 s, doubling with each further',
            "failure up to 30 s: meanwhile batches are dropped (`export_failed`) without being",
            "encoded or sent, and no new trace is started at all (each reconcile left untraced",
            'counts as `reason="paused"`; it has no trace id in its logs or exemplars, since',
            "there is no trace to open). `projector_spans_exported_total` counts what arrived.",
            "The SDK's warnings about failed exports are log lines (event `tracing sdk`). At exit",
            "the controller waits 2 s at most for the last spans (`SPAN_SHUTDOWN_SECONDS`); the",
            "test proves it against a port that reads and never answers.",
            "",
            *overhead(),
        ]
    )


RESULT = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "tracing.json"


def overhead() -> list[str]:
    """The figures of `python -m benchmarks.tracing` (benchmarks/results/tracing.json)."""
    if not RESULT.exists():
        return []
    from benchmarks.tracing import table

    doc = json.loads(RESULT.read_text())
    p, m = doc["parameters"], doc["machine"]
    return [
        "### What it costs, receiver up or down",
        "",
        f"`python -m benchmarks.tracing` on {m.get('cpus', '?')} shared cores ({doc['date']},"
        f" commit `{doc['commit']}`): {p['updates']} timed fan-outs to {p['namespaces']}",
        "copies per mode (end-to-end: the source write sent -> the last copy's watch event;",
        "CPU: the controller's, per copy written), then",
        f"{p['grants']} one-copy grants reconciled {p['rounds']} times each, the resident",
        "memory read after every round (its first tenth, when the span queue has filled, and",
        "the end). The receiver 'down' is a port where nothing listens; 'black-holed' accepts",
        "and never answers; both are timed once an export has failed.",
        "",
        table(doc["systems"]),
        "",
        "Latency stays within noise of tracing off with the receiver down or black-holed, the",
        "exit within its bound, and memory bounded (the full queue, then a plateau). CPU per",
        "write with tracing on is dominated by making and encoding the spans themselves (about",
        "50 µs a span in the SDK, measured in-process), whatever the receiver's state; the",
        "export pause removes part of it during an outage, and `tracing.samplerRatio` scales",
        "it down.",
        "",
    ]


def of(page: str) -> str:
    """The traces section of a page, or '' if it has none."""
    at = page.find(HEADING)
    return page[at:] if at >= 0 else ""


def keep(page: str, old: str) -> str:
    """A freshly drawn `page` with the traces section of the `old` one, if it had one."""
    kept = of(old)
    return replace(page, kept) if kept else page


def replace(page: str, new: str) -> str:
    """`page` with its traces section (appended if it had none) replaced by `new`."""
    at = page.find(HEADING)
    head = page[:at] if at >= 0 else page
    return head.rstrip("\n") + "\n\n" + new.rstrip("\n") + "\n"
