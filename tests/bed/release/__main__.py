"""``python -m tests.bed.release [--registry HOST]``: `make release` (see the package docstring).

Without ``--registry``, the registry ``make registry-up`` started (``.local/registry.env``).
Prints the release notes and where the image, its SBOM and the chart went.
"""

from __future__ import annotations

import argparse
import sys

from tests.bed.controlplane.plane import REPO_ROOT
from tests.bed.helm import chart
from tests.bed.node.images import ImageError
from tests.bed.registry.__main__ import running
from tests.bed.release import ReleaseError, notes, publish


def main(argv: list[str] | None = None) -> int:
    """Publish the checkout; exit 1 with the reason if it cannot be."""
    parser = argparse.ArgumentParser(prog="python -m tests.bed.release", description=__doc__)
    parser.add_argument("--registry", default="", help="HOST[:PORT] of an OCI registry")
    args = parser.parse_args(argv)
    registry = args.registry
    if not registry:
        local = running()
        if local is None:
            print(
                "make release: no REGISTRY= given and no `make registry-up` registry runs",
                file=sys.stderr,
            )
            return 1
        registry = local.host
    try:
        published = publish(REPO_ROOT, registry, chart.helm_binary())
    except (ReleaseError, ImageError) as exc:
        print(f"make release: {exc}", file=sys.stderr)
        return 1
    print(f"# projector {published.version}\n\n{notes(published.version)}\n")
    print(
        f"image:  {published.image}  "
        f"(built in {published.build_seconds:.0f}s from {published.revision})"
    )
    print(f"sbom:   {published.sbom_digest}  (a referrer of the image, CycloneDX)")
    print(f"chart:  {published.chart} --version {published.version}  ({published.chart_digest})")
    print(f"install: helm install projector {published.chart} --version {published.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
