"""Every benchmark's code path runs at tiny sizes, so `make bench` never rots. The numbers
of this run mean nothing and are not checked; the result files' shape is.

Peers run in the tiny fan-out only when already built (`benchmarks/peers/build.sh`, which
`make test` never runs); otherwise the result file says why they are absent, and the peer test
skips naming the missing binary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import all_peers
from tests.bed.controlplane.plane import ControlPlane, cache_dir
from tests.bed.launcher import run_module

EXPECTED = {
    "hotpath",
    "hostile-input",
    "fanout-5",
    "fanout-5-debounce0",
    "tenant",
    "fairness-5",
    "latency",
    "burst",
    "failover",
    "restart",
    "memory",
    "restart-floor",
    "scaling",
}


@pytest.fixture(scope="module")
def tiny(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-tiny")
    result = run_module(
        "benchmarks", "tiny", "--out", out, "--kubeconfig", control_plane.kubeconfig, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def load(out: Path, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    return doc


def test_benchmarks_run_at_tiny_sizes(tiny: Path) -> None:
    assert {p.stem for p in tiny.glob("*.json")} == EXPECTED
    for path in tiny.glob("*.json"):
        doc = json.loads(path.read_text())
        assert {"name", "parameters", "systems", "ratios", "machine", "commit", "date"} <= set(doc)
        assert doc["systems"], path
    burst = load(tiny, "burst")
    assert burst["systems"]["projector"]["final_state_exact"]["value"] is True
    restart = load(tiny, "restart")
    assert restart["systems"]["projector"]["writes_after_restart"]["value"] == 0
    (cold,) = load(tiny, "restart-floor")["points"]
    assert cold["writes"] == [0] and cold["objects_listed"] >= cold["copies_in_cluster"]
    assert 0 < cold["started_s"]["median"] < cold["ready_s"]["median"]  # its port, then its lists
    scaling = load(tiny, "scaling")
    for axis in ("namespaces", "grants", "copies", "unrelated"):
        assert scaling["axes"][axis], axis
        assert all(p["restart_writes"] == 0 for p in scaling["axes"][axis]), axis
    assert scaling["axes"]["rate"][0]["updates"] >= 1
    fanout = load(tiny, "fanout-5")
    for system in ("projector", "floor", "floor (projector's copy bodies)"):
        assert fanout["systems"][system]["last_copy"]["samples"] >= 1
        assert fanout["systems"][system]["client_cpu_per_write"]["samples"] >= 1
        assert fanout["parameters"]["warmup_dropped"][system] >= 1
        # the API server's own cost (its process is on this machine: found by its port)
        assert fanout["systems"][system]["api_server_requests_per_copy"]["median"] >= 1
        assert fanout["systems"][system]["api_server_cpu_per_copy"]["samples"] >= 1
    assert load(tiny, "fanout-5-debounce0")["parameters"]["flags"] == ["--debounce=0"]
    tenant = load(tiny, "tenant")["systems"]["projector"]
    for metric in ("new_namespace", "new_namespace_in_burst", "burst_last_copy"):
        assert tenant[metric]["samples"] >= 1, metric
    for metric in ("revoked_relabelled", "revoked_grant_deleted"):
        assert tenant[metric]["samples"] >= 1, metric
    fair = load(tiny, "fairness-5")["systems"]
    with_apf, without = fair["projector (with FlowSchema)"], fair["projector (without FlowSchema)"]
    assert with_apf["projector_level"] == "projector"  # its requests served in its own level
    assert without["projector_level"] == "workload-low"
    for mode in (with_apf, without):
        assert mode["copies_written"] == 5 and mode["probe_levels"] == ["workload-low"]
        assert mode["probe_GET_idle"]["samples"] >= 1
    for peer in all_peers():
        present = any(s.startswith(f"{peer.name} ") for s in fanout["systems"])
        assert present or peer.name in fanout["parameters"]["peers_unavailable"], peer.name


@pytest.mark.parametrize("peer", [p.name for p in all_peers()])
def test_peer_fanout_at_tiny_size(tiny: Path, peer: str) -> None:
    p = next(x for x in all_peers() if x.name == peer)
    if p.built() is None:
        pytest.skip(
            f"{p.name} {p.version} not built: no {cache_dir() / 'peers'}/{p.name}-{p.version}/ "
            "(run benchmarks/peers/build.sh; make test never builds peers)"
        )
    fanout = load(tiny, "fanout-5")
    key = f"{p.name} {p.version}"
    assert key in fanout["systems"], fanout["parameters"]["peers_unavailable"]
    assert fanout["systems"][key]["last_copy"]["samples"] >= 1
