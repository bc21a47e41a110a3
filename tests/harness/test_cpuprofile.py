"""benchmarks.cpuprofile's summary of py-spy's collapsed stacks (pure: no process sampled)."""

from __future__ import annotations

import pytest

from benchmarks.cpuprofile import component, summarize

ROOT = "main (projector/app.py:320);Runner.run (asyncio/runners.py:118)"
WRITE = (
    f"{ROOT};Writer._send (projector/control/writer.py:157);"
    "Kube.send (projector/client/kube.py:218)"
)
COLLAPSED = "\n".join(
    [
        f"{ROOT} 20",  # uvloop's native loop, under the last Python frame
        f"{WRITE};ClientSession._request (.venv/lib/site-packages/aiohttp/client.py:819) 50",
        f"{WRITE} 10",
        f"{ROOT};Informer._apply (projector/cache/informer.py:151);"
        "parse_copy (projector/core/model.py:1) 20",
        f"{ROOT};metrics_handler (projector/telemetry/endpoints.py:24) 400",  # the bench's scrapes
    ]
)


def test_self_time_is_summed_by_component_and_scrapes_are_left_out() -> None:
    summary = summarize(COLLAPSED)
    assert summary["samples"] == 100
    assert dict(map(tuple, summary["self_by_component"])) == {
        "aiohttp (HTTP client)": 50.0,
        "event loop": 20.0,
        "projector/model": 20.0,
        "projector/kube": 10.0,
    }


def test_inclusive_shares_name_projectors_functions_but_not_its_entry_points() -> None:
    inclusive = dict(map(tuple, summarize(COLLAPSED)["projector_inclusive"]))
    assert inclusive["Writer._send (projector/writer)"] == 60.0
    assert inclusive["Kube.send (projector/kube)"] == 60.0
    assert inclusive["Informer._apply (projector/informer)"] == 20.0
    assert "main (projector/app)" not in inclusive


def test_an_empty_profile_is_an_error_not_zero_shares() -> None:
    with pytest.raises(ValueError, match="no samples"):
        summarize(f"{ROOT};metrics_handler (projector/telemetry/endpoints.py:24) 5")


def test_components_of_paths() -> None:
    assert component("/x/projector/cache/store.py") == "projector/store"
    assert component("/usr/lib/python3.11/asyncio/base_events.py") == "event loop"
    assert component("<frozen importlib._bootstrap>") == "other (interpreter, libraries)"
