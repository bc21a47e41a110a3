"""`projector validate` offline, in process: ProjectionExports beside ProjectionGrants.

The corpus of malformed exports, `tests/data/bad_exports/` (one per file; its header says what
the refusals must say, as `tests/data/bad_grants/`'s does), is refused here with file:line, the
field and the CRD's message, and its header says what the controller's own `parse_export`
does with it (skips it, or it lets nobody or no key through): an export stored before a CRD
rule existed never widens anything. `tests/data/good_exports/` passes. That the real API
server refuses and accepts the same documents is `tests/integration/test_validate.py`'s part.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from projector.core import validate
from projector.core.exports import parse_export
from projector.core.names import is_secret_key, is_subdomain

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
BAD = sorted((DATA / "bad_exports").glob("*.yaml"))
GOOD = sorted((DATA / "good_exports").glob("*.yaml"))
CHART_CRDS = REPO / "deploy" / "helm" / "projector" / "crds"
_HEADER = re.compile(r"# ([a-z-]+): (.+)")
PROBES = (
    *("dask-gateway", "team-a", "team-b", "team-0-x", "pack-0", "stage-b"),
    *("kube-system", "jupyterhub"),
)
"""Namespaces a bad export might reach: what its `to` says, a glob's match, and others."""


def header(path: Path) -> dict[str, str]:
    """The `# key: value` lines of a corpus file."""
    return {
        m.group(1): m.group(2)
        for line in path.read_text().splitlines()
        if (m := _HEADER.fullmatch(line)) is not None
    }


@pytest.fixture(scope="module")
def crds() -> dict[str, validate.Crd]:
    return validate.load_crds()


def check(crds: dict[str, validate.Crd], path: Path) -> tuple[dict[str, int], list[str]]:
    found, errors = validate.check_file(crds, path)
    return found, [str(e) for e in errors]


def test_the_corpus_holds_the_cases_issue_37_names() -> None:
    names = {p.stem for p in BAD}
    assert {
        "no-to",
        "to-empty",
        "to-negation",
        "to-33-globs",
        "keys-257",
        "key-slash",
        "source-kind-pod",
        "no-source-name",
    } <= names
    assert len(BAD) >= 15 and len({header(p)["field"] for p in BAD}) >= 7


def test_both_kinds_are_validated_by_default(crds: dict[str, validate.Crd]) -> None:
    assert set(crds) == {"ProjectionGrant", "ProjectionExport"}
    assert crds["ProjectionExport"].namespaced and not crds["ProjectionGrant"].namespaced
    assert crds["ProjectionExport"].schemas.keys() == {"projector.nebari.dev/v1alpha1"}


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_a_bad_export_is_refused_with_file_line_field_and_message(
    crds: dict[str, validate.Crd], path: Path
) -> None:
    h = header(path)
    found, errors = check(crds, path)
    assert found == {"ProjectionExport": 1}
    assert len(errors) == int(h.get("errors", "1")), errors
    expected = f"{path}:{h['line']}: {h['field']}: "
    named = [e for e in errors if e.startswith(expected)]
    assert named, errors
    assert any(h.get("validate", h.get("message", "")) in e for e in named), named
    assert all(len(e) < 300 for e in errors), "a message quotes a whole list"


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_the_controller_never_lets_a_bad_export_widen_anything(path: Path) -> None:
    """What `parse_export` does with it, if the API server ever stored it (a CRD older than a
    rule, a server without CEL): as its header says."""
    h = header(path)
    doc = yaml.safe_load(path.read_text())
    if "controller-accepts" in h:
        parse_export(doc)  # harmless to the controller, and said why in the file
        return
    verdict = h["controller"].split(" (")[0]
    if verdict == "skips":
        with pytest.raises((KeyError, TypeError, ValueError)):
            parse_export(doc)  # the cache skips what fails so (projector.cache.caches)
        return
    export = parse_export(doc)
    reached = {ns for ns in PROBES if export.exports_to(ns)}
    if verdict == "nobody":
        assert not reached
    elif verdict.startswith("only "):
        assert reached == {verdict.removeprefix("only ")}
    elif verdict == "no key":
        assert export.refused or (
            export.keys is not None and not any(map(is_secret_key, export.keys))
        )
    elif verdict == "no source":
        assert not is_subdomain(export.source.name)
    else:
        pytest.fail(f"unknown controller verdict {h['controller']!r}")


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_the_good_exports_pass(crds: dict[str, validate.Crd], path: Path) -> None:
    found, errors = check(crds, path)
    assert not errors and found.get("ProjectionExport", 0) >= 1
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["kind"] == "ProjectionExport":
            doc["metadata"].setdefault("namespace", "jupyterhub")
            export = parse_export(doc)
            assert not export.refused and not export.ignored_to, export


def test_grants_and_exports_in_one_file_are_each_checked_against_their_own_crd(
    crds: dict[str, validate.Crd], tmp_path: Path
) -> None:
    mixed = tmp_path / "pack.yaml"
    mixed.write_text(
        """apiVersion: projector.nebari.dev/v1alpha1
kind: ProjectionGrant
metadata: {name: g}
spec:
  source: {namespace: jupyterhub, name: hub}
  target: {namespaces: [dask-gateway]}
  to: [dask-gateway]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated, namespace: jupyterhub}
data: {to: "!"}
---
apiVersion: projector.nebari.dev/v1alpha1
kind: ProjectionExport
metadata: {name: e, namespace: jupyterhub}
spec:
  source: {name: hub}
  target: {namespaces: [dask-gateway]}
  to: ['!x']
"""
    )
    found, errors = check(crds, mixed)
    assert found == {"ProjectionGrant": 1, "ProjectionExport": 1}
    assert errors == [
        f"{mixed}:7: spec.to: unknown field (the API server would drop it)",  # not a grant's
        f"{mixed}:19: spec.target: unknown field (the API server would drop it)",  # nor an export's
        f"{mixed}:20: spec.to[0]: '!x' does not match '^[a-z0-9*?\\\\[][-a-z0-9*?\\\\[\\\\]]*$'",
    ]


def test_a_namespaced_kind_s_namespace_is_checked_and_may_be_left_out(
    crds: dict[str, validate.Crd], tmp_path: Path
) -> None:
    path = tmp_path / "e.yaml"
    body = "spec: {source: {name: hub}, to: [dask-gateway]}\n"
    head = "apiVersion: projector.nebari.dev/v1alpha1\nkind: ProjectionExport\n"
    path.write_text(head + "metadata: {name: e}\n" + body)
    assert check(crds, path) == ({"ProjectionExport": 1}, [])
    path.write_text(head + "metadata: {name: e, namespace: Team_A}\n" + body)
    assert check(crds, path)[1] == [
        f"{path}:3: metadata.namespace: must be a DNS-1123 label (lower case, digits, '-')"
    ]


def test_a_crd_given_replaces_only_its_own_kind(tmp_path: Path) -> None:
    """`--crd`: validate reads its rules from the CRD file, so a rule added there is enforced
    (for exports as for grants), and the other kind keeps the packaged CRD."""
    crd = yaml.safe_load((CHART_CRDS / "projector.nebari.dev_projectionexports.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec.setdefault("x-kubernetes-validations", []).append(
        {"rule": "self.source.name != 'forbidden'", "message": "not that one"}
    )
    changed = tmp_path / "crd.yaml"
    changed.write_text(yaml.safe_dump(crd))
    crds = validate.load_crds([changed])
    assert crds["ProjectionExport"].source == str(changed)
    assert crds["ProjectionGrant"].source != str(changed)
    export = tmp_path / "e.yaml"
    export.write_text(
        "apiVersion: projector.nebari.dev/v1alpha1\nkind: ProjectionExport\n"
        "metadata: {name: e, namespace: a}\nspec: {source: {name: forbidden}, to: [b]}\n"
    )
    assert check(validate.load_crds(), export)[1] == []
    assert check(crds, export)[1] == [f"{export}:4: spec: not that one"]


def test_the_wheel_carries_every_crd_validate_loads() -> None:
    """The hatch force-include table puts each kind's chart CRD where `Crd.load` looks for it
    in an installed package (the image has no checkout)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    table: dict[str, str] = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for resource, chart_file in validate.CRDS.values():
        source = f"deploy/helm/projector/crds/{chart_file}"
        assert table.get(source) == f"projector/{resource}", source
        assert (REPO / source).is_file()


def test_size_errors_say_the_bound_not_the_whole_value(
    crds: dict[str, validate.Crd], tmp_path: Path
) -> None:
    path = tmp_path / "e.yaml"
    doc: dict[str, Any] = {
        "apiVersion": "projector.nebari.dev/v1alpha1",
        "kind": "ProjectionExport",
        "metadata": {"name": "e", "namespace": "a"},
        "spec": {
            "source": {"name": "hub"},
            "keys": ["k" * 300],
            "to": [f"n{i}" for i in range(300)],
        },
    }
    path.write_text(yaml.safe_dump(doc))
    errors = check(crds, path)[1]
    assert sorted(e.split(": ", 1)[1] for e in errors) == [
        "spec.keys[0]: too long: 300: may not be longer than 253",
        "spec.to: too many: 300: must have at most 256 items",
    ]


def test_exports_open_to_any_namespace_and_naming_their_own_are_warned_about(
    tmp_path: Path,
) -> None:
    (tmp_path / "pack.yaml").write_text(
        """apiVersion: projector.nebari.dev/v1alpha1
kind: ProjectionExport
metadata: {name: open, namespace: jupyterhub}
spec: {source: {name: hub}, to: [jupyterhub, team-*]}
---
apiVersion: projector.nebari.dev/v1alpha1
kind: ProjectionExport
metadata: {name: closed, namespace: jupyterhub}
spec: {source: {kind: ConfigMap, name: hub}, to: [dask-gateway]}
---
apiVersion: projector.nebari.dev/v1alpha1
kind: ProjectionGrant
metadata: {name: by-label}
spec:
  source: {namespace: jupyterhub, name: hub}
  target: {namespaceSelector: {matchLabels: {nebari.dev/pack: dask}}}
---
apiVersion: projector.nebari.dev/v1alpha1
kind: ProjectionGrant
metadata: {name: configmap-by-label}
spec:
  source: {kind: ConfigMap, namespace: jupyterhub, name: hub}
  target: {namespaceSelector: {matchLabels: {nebari.dev/pack: dask}}}
"""
    )
    warned = validate.consent_warnings([tmp_path])
    assert len(warned) == 2, warned
    assert "ProjectionGrant by-label: selects namespaces by label" in warned[0]
    assert "is exported to 'jupyterhub,team-*' by ProjectionExport jupyterhub/open" in warned[0]
    assert "ProjectionExport jupyterhub/open: spec.to names its own namespace" in warned[1]
