"""Generators of what operators read: the metrics reference, the alert rules and the dashboard.

Each artefact is code here and a committed file (``docs/metrics.md``, ``deploy/prometheus/``,
``deploy/grafana/projector.json``); ``python -m tests.bed.observability`` (``make generate``)
rewrites them and ``python -m tests.bed.observability --check`` (run by the unit tests) fails
when one is stale. This package is a development tool: the controller never imports it.
"""
