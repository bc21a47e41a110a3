"""What a tenant's input costs the event loop, at each parser's cap (issue 36), with no server.

Every event of an export-labelled Secret or ConfigMap is parsed (`model.parse_source`), every
event of a workload (`rollout.rollout_on`); a grant's namespaces are matched against the
producer's globs (`Source.exports_to`). Each is timed on the largest input its cap lets
through, and on the review's bomb (a 240 KiB export-to of 20,000 entries), which the cap
refuses before splitting. Target: none of them blocks the loop for more than a few ms.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, summary, write_result
from projector.core.model import (
    EXPORT_LABEL,
    EXPORT_TO_ANNOTATION,
    MAX_EXPORT_TO_ENTRIES,
    MAX_EXPORT_TO_GLOBS,
    _globs_regex,
    parse_source,
)
from projector.rollout.decide import MAX_ROLLOUT_ON_ENTRIES, ROLLOUT_ON, rollout_on

BOMB = ",".join(f"-bad-{i}" for i in range(20_000))
"""The review's export-to: 240 KiB of invalid entries, under the API server's limit."""


def secret(export_to: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "tenant",
            "name": "s",
            "uid": "u",
            "labels": {EXPORT_LABEL: "true"},
            "annotations": {EXPORT_TO_ANNOTATION: export_to},
        },
        "data": {"k": "dg=="},
    }


def at_cap() -> str:
    """256 entries, 32 of them globs and 32 invalid, each as long as a name may be."""
    pad = "x" * 50
    globs = [f"t{i}-*-{pad}" for i in range(MAX_EXPORT_TO_GLOBS)]
    bad = [f"-bad-{i}" for i in range(32)]
    names = [f"team-{i}-{pad}" for i in range(MAX_EXPORT_TO_ENTRIES - len(globs) - len(bad))]
    value = ",".join(names + bad + globs)
    assert not parse_source(secret(value)).export_to_refused, "the at-cap input was refused"
    return value


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds per call, one sample per repeat."""
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return samples


def run(repeats: int = 50, out: Path = RESULTS) -> Path:
    cap = at_cap()
    src = parse_source(secret(cap))
    namespaces = [f"team-{i}-ns" for i in range(1_000)]
    rollout_cap = ",".join(f"copy-{i}-{'y' * 200}" for i in range(MAX_ROLLOUT_ON_ENTRIES))

    def compile_globs() -> None:
        _globs_regex.cache_clear()
        re.purge()
        src.exports_to("nowhere")

    def match_all() -> None:
        for n in namespaces:
            src.exports_to(n)

    m = {
        "parse_source export-to at cap (256 entries, 16 KiB)": timed(
            lambda: parse_source(secret(cap)), repeats
        ),
        "parse_source export-to bomb (20,000 entries, 240 KiB)": timed(
            lambda: parse_source(secret(BOMB)), repeats
        ),
        "compile the 32 globs of one source at cap (first match)": timed(compile_globs, repeats),
        "exports_to over 1,000 namespaces, globs at cap": timed(match_all, repeats),
        "rollout_on at cap (64 names, 13 KiB)": timed(
            lambda: rollout_on({ROLLOUT_ON: rollout_cap}), repeats
        ),
        "rollout_on bomb (240 KiB)": timed(lambda: rollout_on({ROLLOUT_ON: BOMB}), repeats),
    }
    systems = {"projector": {k: summary(v, "ms") for k, v in m.items()}}
    return write_result("hostile-input", {"repeats": repeats}, systems, out=out)


if __name__ == "__main__":
    print(run())
