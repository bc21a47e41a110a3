"""Generators of what operators read: the metrics reference, the alert rules and the dashboard.

Each artefact is code here and a committed file (``docs/metrics.md``, ``deploy/prometheus/``,
``deploy/grafana/projector.json``); ``python -m observability`` rewrites them and
``python -m observability --check`` (run by the unit tests) fails when one is stale. This package
is a development tool: the controller never imports it.
"""
