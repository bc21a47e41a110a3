"""``python -m tests.bed.observability [--check]``: write the generated files, or fail if stale."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from tests.bed.observability import dashboard, metricsdoc, rules

REPO = Path(__file__).resolve().parents[3]

ARTEFACTS: dict[str, Callable[[], str]] = {
    "docs/metrics.md": metricsdoc.render,
    "deploy/grafana/projector.json": dashboard.render,
    "deploy/prometheus/rules.yaml": rules.rules_yaml,
    "deploy/prometheus/prometheusrule.yaml": rules.prometheus_rule_yaml,
    "deploy/helm/projector/files/prometheus-rules.yaml": rules.chart_rules_yaml,
    "deploy/helm/projector/dashboards/projector.json": dashboard.render,
}
"""Each generated file, relative to the repository root, and the function that renders it."""


def stale() -> list[str]:
    """The generated files whose committed text differs from what the code renders."""
    out = []
    for rel, render in ARTEFACTS.items():
        path = REPO / rel
        if not path.exists() or path.read_text() != render():
            out.append(rel)
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite every artefact, or with --check list the stale ones and exit 1."""
    p = argparse.ArgumentParser(prog="python -m tests.bed.observability")
    p.add_argument("--check", action="store_true", help="only check, write nothing")
    args = p.parse_args(argv)
    if args.check:
        bad = stale()
        for rel in bad:
            print(f"stale: {rel} (run `make generate`)", file=sys.stderr)
        return 1 if bad else 0
    for rel, render in ARTEFACTS.items():
        path = REPO / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render())
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
