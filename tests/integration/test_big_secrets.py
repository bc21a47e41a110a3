"""Large Secrets (issue 10): memory stays bounded, and payloads at the API's limits project.

The memory target is the Deployment's: 150 copies of a 1 MiB Secret must not push the
controller past 200 MiB, neither while it fans out nor when it restarts and relists them all
(before paging, one 190 MiB page of copies was held and parsed whole on every start).
"""

from __future__ import annotations

import secrets
from typing import Any

from tests.launcher import ControllerProcess
from tests.support import Cluster, NamespaceFactory, eventually

MAX_SECRET = 1024 * 1024
"""The API server's limit on a Secret's data (the sum of its values' sizes)."""
COPIES = 150
RSS_LIMIT_MIB = 200


def canary(size: int) -> str:
    """A canary value of exactly `size` ASCII bytes."""
    return ("CANARY-" + secrets.token_urlsafe(size))[:size]


def projected(k8s: Cluster, grant: str) -> int:
    return int((k8s.status(grant).get("targets") or {}).get("projected", 0))


def test_150_copies_of_a_1_mib_secret_stay_under_200_mib(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any
) -> None:
    src = make_namespace()
    label = {"projector-test/big": src}
    for _ in range(COPIES):
        make_namespace(labels=label)
    k8s.source(src, "big", {"blob": canary(MAX_SECRET - 1024)}, export_to="*")
    first: ControllerProcess = start_controller()
    g = k8s.grant((src, "big"), selector={"matchLabels": label})
    eventually(lambda: projected(k8s, g) == COPIES, timeout=240, message="150 copies written")
    eventually(first.settled, timeout=60)
    fan_out = first.peak_rss_mib()
    assert first.stop() == 0
    second: ControllerProcess = start_controller()  # lists 150 MiB of copies again
    eventually(second.settled, timeout=120)
    relist = second.peak_rss_mib()
    print(f"peak RSS (VmHWM): fan-out {fan_out:.0f} MiB, restart {relist:.0f} MiB")
    assert second.writes() == 0  # every copy was up to date, and seen to be
    assert max(fan_out, relist) < RSS_LIMIT_MIB, (
        f"peak RSS: fan-out {fan_out:.0f} MiB, restart {relist:.0f} MiB"
    )
