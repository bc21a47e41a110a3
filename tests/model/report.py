"""What `make fuzz` covered, as JSON (.local/fuzz/) and as a section of docs/reliability.md.

`python -m tests.model.report [FILE.json ...]` renders the given summaries (default: every one
in .local/fuzz/) into the section of docs/reliability.md between the markers below, leaving
the rest of the page (what `make reliability-docs` writes) as it is. Defects found and fixed
are listed from `DEFECTS`, which is kept by hand: each one names its regression case.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.model.driver import Stats
from tests.model.operations import FAULT_OPS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
RESULTS = REPO / ".local" / "fuzz"
BEGIN = "<!-- model-based testing: rendered by `python -m tests.model.report`; do not edit -->"
END = "<!-- model-based testing: end -->"

DEFECTS: list[tuple[str, str, str]] = [
    (
        "an older grant the producer lets in by a ProjectionExport alone lost its place to a "
        "younger grant aiming at the same copy (DESIGN §2: the older grant holds it), found by "
        "the exhaustive small-world comparison and by make fuzz (seed 38)",
        "the senior-rival check asks the producer's consent with the rival source's exports, "
        "not its label alone (ae365b3)",
        "an-older-grant-let-in-by-an-export-holds-its-place",
    ),
]
"""(what broke, the fix, the regression case in tests/integration/test_model_based.py)."""

FINDINGS = [
    "the first comparison of the planner with the oracle (tests/unit/test_oracle.py) disagreed "
    "twice, and both times the oracle's first reading was the one to change: a grant re-created "
    "under its name takes its predecessor's copy over where it aims (even one recorded "
    "onRevoke Delete, kept while the new grant lacks a key), which DESIGN §2-3 neither allow "
    "nor forbid (now the ambiguity AMBIGUOUS_ADOPTION); and a younger grant whose source "
    "became a refused type gives its copy up by onRevoke even where an older grant aims but "
    "writes nothing",
    "DESIGN §3 is ambiguous in four places the oracle names and accepts every reading of "
    "(tests/model/oracle.py): adoption by a re-created grant; whether an older grant with a "
    "refused source still blocks a younger one; the policy a copy follows when its grant's "
    "onRevoke changed before the copy recorded it; onSourceDeleted or onRevoke for a copy "
    "whose source is deleted where it is no longer targeted",
    "ProjectionExports and export-keys joined the model (2026-12-05): DESIGN §2-3 leave three "
    "more choices open, each accepted either way and named in tests/model/oracle.py: a grant "
    "without keys where the producer's scope leaves none of the source's keys (a copy holding "
    "no key, or nothing written); whether an older grant naming a key the producer does not "
    "export there still holds the place against a younger one; and whether a Secret carrying "
    "projector's mark (a copy) that an export names is projected on (projector refuses it: "
    "SourceRefused, 'a copy is never projected on', which DESIGN does not list)",
    "the oracle was corrected twice by make fuzz after exports joined: a copy standing at a "
    "key some grant names as its source was taken for a foreign Secret at its own place, so "
    "its own grant could never remove it (seed 569966150); and the controller may act on its "
    "grants as they were at one moment and on sources, exports and namespaces as they were at "
    "another, since watch streams of different kinds are not ordered with each other (seed "
    "455749577: a grant deleted, then an export created; seen in the other order after a "
    "reconnection, the grant wrote a copy its Retain then kept)",
]
"""What the model-based tests taught besides defects (kept by hand)."""


def summary(stats: Stats, seeds: Sequence[int], faults: Sequence[str], ops: int) -> dict[str, Any]:
    fault_names = {op.__name__ for op in FAULT_OPS}
    return {
        "date": datetime.now(UTC).isoformat(" ", "seconds"),
        "runs": stats.runs,
        "seeds": list(seeds),
        "ops_per_seed": ops,
        "faults_enabled": list(faults),
        "seconds": round(stats.seconds, 1),
        "operations": dict(stats.ops),
        "faults": {k: v for k, v in stats.ops.items() if k in fault_names},
        "refused": dict(stats.refused),
        "observations": stats.observations,
        "place_checks": stats.place_checks,
        "convergences": stats.convergences,
        "settled": dict(stats.settled),
        "ambiguous": dict(stats.ambiguous),
    }


def render(docs: Sequence[dict[str, Any]]) -> str:
    """The section for these summaries (summed)."""
    ops: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    ambiguous: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    seeds: list[int] = []
    totals = Counter[str]()
    for d in docs:
        ops.update(d["operations"])
        faults.update(d["faults"])
        settled.update(d["settled"])
        ambiguous.update(d["ambiguous"])
        refused.update(d["refused"])
        seeds += d["seeds"]
        for k in ("runs", "observations", "place_checks", "convergences"):
            totals[k] += d[k]
        totals["seconds"] += d["seconds"]
    failures = [d["failure"] for d in docs if "failure" in d]
    changes = sum(n for k, n in ops.items() if k != "Converge")
    last = max(d["date"] for d in docs)
    lines = [
        BEGIN,
        "",
        "## Model-based testing (`make fuzz`)",
        "",
        "Random operation sequences against the real API server and the real controller, judged "
        "after every operation by invariants and at each convergence point by an independent "
        "oracle of DESIGN §3 (`tests/model/`, `tests/integration/test_model_based.py`). "
        "Invariants after every operation: S0 each place holds a state some sequence of correct "
        "steps reaches; "
        "S1 nothing projector does not own (sources, squatters, bystanders) is modified or "
        "deleted; S2 every copy holds a projection that was consented at some moment, into that "
        "place; S3 no copy is written in its grant's source namespace; S4 a copy wanted throughout "
        "is never gone or re-created (no delete on uncertainty). Canaries (every Secret value) are "
        "scanned in the controller's logs, metrics, the grants' statuses and Events, and the "
        "runs' namespaces' Events.",
        "",
        f"Summed over {len(docs)} `make fuzz` session(s), the last on {last} UTC:",
        "",
        "| what | how many |",
        "|---|---|",
        f"| runs (one seed each, a fresh universe and controller) | {totals['runs']} |",
        f"| seeds | {len(set(seeds))} |",
        f"| operations that change the cluster | {changes} |",
        f"| of which refused or not applicable (no change) | {sum(refused.values())} |",
        f"| faults injected | {sum(faults.values())} |",
        f"| observations (all invariants checked) | {totals['observations']} |",
        f"| place checks (S0, S2-S4 per place) | {totals['place_checks']} |",
        f"| convergence points (exact oracle check) | {totals['convergences']} |",
        f"| wall time | {totals['seconds'] / 60:.0f} min |",
        "",
        "Operations: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())) + ".",
        "",
        "Faults: " + (", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "none") + ".",
        "",
        "Places at convergence points: "
        + ", ".join(f"{k} {v}" for k, v in sorted(settled.items()))
        + "; of which an ambiguity of DESIGN §3 shaped the expectation: "
        + (", ".join(f"{v} ({k})" for k, v in sorted(ambiguous.items())) or "none")
        + ".",
        "",
        "Defects found: "
        + (
            "; ".join(f"{what} (fixed: {fix}; case `{case}`)" for what, fix, case in DEFECTS)
            if DEFECTS
            else "none"
        )
        + ".",
    ]
    lines += ["", "Findings:", ""] + [f"- {f}." for f in FINDINGS]
    if failures:
        lines += ["", "Open failures of these sessions:", ""]
        lines += [f"- seed {f['seed']}: {f['violation'].splitlines()[0]}" for f in failures]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def splice(page: str, section: str) -> str:
    """The page with its model-based section replaced (or appended)."""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        return head + section + ("\n" + tail if tail else "")
    return page.rstrip("\n") + "\n\n" + section


def main(argv: Sequence[str]) -> None:
    files = [Path(a) for a in argv] or sorted(RESULTS.glob("fuzz-*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    if not docs:
        raise SystemExit(f"no fuzz summaries given or in {RESULTS}")
    DOC.write_text(splice(DOC.read_text(), render(docs)))
    print(DOC)


if __name__ == "__main__":
    main(sys.argv[1:])
