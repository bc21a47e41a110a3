"""`projector validate` against the real API server: it must refuse what the server refuses.

The one corpus of malformed grants, `tests/data/bad_grants/` (one per file, its header saying
what the refusals must say), is refused by validate (with file:line, the field and the CRD's
message), by the API server (a strict dry-run create, and a real one, as `kubectl apply` sends
it) and by the controller's own `parse_grant`; every grant in grants/ passes validate and the
server. validate reads the CRD itself, so a rule added to the CRD is enforced offline too.

ProjectionExports likewise: the corpus `tests/data/bad_exports/` is refused by validate (here
through the command, the rest in process by tests/unit/test_validate.py, which also holds what
`parse_export` does with each) and by the API server, in a namespace of this module's, naming
the same field, with the CRD's message or (`server:`) the server's words for the same refusal;
`tests/data/good_exports/` (one file holds a grant and an export) passes both.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from projector.core.grantspec import parse_grant
from projector.errors import InvalidGrant
from tests.bed.kube import unique_name
from tests.bed.launcher import REPO, validate

DATA = REPO / "tests" / "data"
CORPUS = DATA / "bad_grants"
EXPORTS_CORPUS = DATA / "bad_exports"
GOOD_EXPORTS = DATA / "good_exports"
GROUP, VERSION, PLURAL = "projector.nebari.dev", "v1alpha1", "projectiongrants"
EXPORTS = "projectionexports"


# --- the corpus of malformed grants ---------------------------------------------------------------

_HEADER = re.compile(
    r"# (field|message|validate|server|line|errors|status|controller|controller-accepts): (.+)"
)


@dataclass(frozen=True)
class BadGrant:
    """One corpus file and what its refusals must say, from its `# key: value` header."""

    path: Path
    field: str
    """The field both refusals name."""
    message: str = ""
    """Part of the message, where both refusals quote the CRD's own rule message."""
    validate: str = ""
    """Part of validate's message, where the API server words its refusal differently."""
    line: int = 0
    """The line validate reports the refusal at (0: not pinned)."""
    errors: int = 1
    """How many errors validate reports in the file."""
    status: int = 422
    """The API server's HTTP status for a strict create of it."""
    controller_accepts: str = ""
    """Why the controller's parse_grant may accept it (harmless to it), if it does."""
    server: str = ""
    """Part of the API server's message, where it words the refusal differently."""

    @classmethod
    def load(cls, path: Path) -> BadGrant:
        header: dict[str, str] = {}
        for line in path.read_text().splitlines():
            if (m := _HEADER.fullmatch(line)) is not None:
                header[m.group(1)] = m.group(2)
        return cls(
            path,
            header["field"],
            header.get("message", ""),
            header.get("validate", ""),
            int(header.get("line", "0")),
            int(header.get("errors", "1")),
            int(header.get("status", "422")),
            header.get("controller-accepts", ""),
            header.get("server", ""),
        )

    @property
    def relative(self) -> str:
        """The path validate prints, from the repository."""
        return str(self.path.relative_to(REPO))

    def __str__(self) -> str:
        return self.path.stem


BAD_GRANTS = [BadGrant.load(p) for p in sorted(CORPUS.glob("*.yaml"))]
PINNED = [g for g in BAD_GRANTS if g.line]
BAD_EXPORTS = [BadGrant.load(p) for p in sorted(EXPORTS_CORPUS.glob("*.yaml"))]


def _shipped(kind: str) -> int:
    """How many documents of `kind` grants/ holds."""
    return sum(
        1
        for f in (REPO / "grants").rglob("*.yaml")
        for doc in yaml.safe_load_all(f.read_text())
        if doc and doc.get("kind") == kind
    )


def test_the_shipped_grants_pass() -> None:
    result = validate("grants/")
    assert result.returncode == 0, result.stdout + result.stderr
    shipped, exports = _shipped("ProjectionGrant"), _shipped("ProjectionExport")
    assert shipped >= 3  # the ConfigMap example among them
    assert f"{shipped} ProjectionGrant(s), {exports} ProjectionExport(s)" in result.stderr
    assert result.stderr.rstrip().endswith(": ok"), result.stderr


@pytest.fixture(scope="module")
def bad_run() -> subprocess.CompletedProcess[str]:
    """One run over the corpus and the good grants: every error is reported, exit 1."""
    return validate(CORPUS.relative_to(REPO), "grants/")


def test_every_error_of_a_directory_is_reported_and_the_exit_is_1(
    bad_run: subprocess.CompletedProcess[str],
) -> None:
    shipped_files = list((REPO / "grants").rglob("*.yaml"))
    shipped = _shipped("ProjectionGrant")
    errors = sum(g.errors for g in BAD_GRANTS)
    assert errors > len(BAD_GRANTS)  # a file with two errors has both reported
    assert bad_run.returncode == 1
    assert len(bad_run.stdout.splitlines()) == errors
    grants, files = len(BAD_GRANTS) + shipped, len(BAD_GRANTS) + len(shipped_files)
    exports = _shipped("ProjectionExport")
    assert (
        f"{grants} ProjectionGrant(s), {exports} ProjectionExport(s) in {files} file(s): "
        f"{errors} error(s)"
    ) in bad_run.stderr


def test_the_file_line_cases_are_many() -> None:
    assert len(PINNED) >= 9


@pytest.mark.parametrize("bad", PINNED, ids=str)
def test_a_bad_grant_is_refused_with_file_line_field_and_message(
    bad_run: subprocess.CompletedProcess[str], bad: BadGrant
) -> None:
    expected = f"{bad.relative}:{bad.line}: {bad.field}: "
    hits = [x for x in bad_run.stdout.splitlines() if expected in x]
    assert hits and (bad.validate or bad.message) in hits[0], bad_run.stdout


def test_yaml_errors_wrong_versions_and_missing_files_fail() -> None:
    broken = validate(DATA / "not-yaml.yaml")
    assert broken.returncode == 1 and "not-yaml.yaml:5: (yaml):" in broken.stdout
    wrong = validate(DATA / "wrong-version.yaml")
    assert wrong.returncode == 1
    assert "wrong-version.yaml:1: apiVersion: must be one of: projector.nebari.dev/v1alpha1" in (
        wrong.stdout
    )
    missing = validate(DATA / "no-such-file.yaml")
    assert missing.returncode == 1 and "no-such-file.yaml:0: (file):" in missing.stdout
    nothing = validate(REPO / "deploy" / "kustomization.yaml")
    assert nothing.returncode == 1
    assert "no ProjectionGrant or ProjectionExport found" in nothing.stderr


def test_a_rule_added_to_the_crd_is_enforced(tmp_path: Path) -> None:
    """validate reads its rules from the CRD file, not from a copy of them."""
    crd = yaml.safe_load(
        (REPO / "deploy/helm/projector/crds/projector.nebari.dev_projectiongrants.yaml").read_text()
    )
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec.setdefault("x-kubernetes-validations", []).append(
        {"rule": "self.source.namespace != 'forbidden'", "message": "not from there"}
    )
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(crd))
    grant = tmp_path / "g.yaml"
    grant.write_text(
        (REPO / "grants" / "jupyterhub-token-to-dask-gateway.yaml")
        .read_text()
        .replace("namespace: jupyterhub", "namespace: forbidden")
    )
    assert validate(grant).returncode == 0
    result = validate(f"--crd={path}", grant)
    assert result.returncode == 1 and "spec: not from there" in result.stdout


def _server_accepts(custom: client.CustomObjectsApi, doc: dict[str, Any]) -> str | None:
    """A strict dry-run create under a fresh name (other tests may hold the shipped names)."""
    doc = {**doc, "metadata": {**doc["metadata"], "name": unique_name("validate-dry-run")}}
    try:
        custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, doc, dry_run="All", field_validation="Strict"
        )
    except client.ApiException as e:
        return str(e.body)
    return None


@pytest.mark.parametrize("bad", BAD_GRANTS, ids=str)
def test_the_api_server_refuses_the_same_bad_grants(
    custom_objects: client.CustomObjectsApi, bad: BadGrant
) -> None:
    doc = yaml.safe_load(bad.path.read_text())
    refused = _server_accepts(custom_objects, doc)
    assert refused is not None, f"the API server accepted {bad.path.name}, validate refuses it"


def test_the_api_server_accepts_the_shipped_grants(
    custom_objects: client.CustomObjectsApi, export_namespace: str
) -> None:
    for path in sorted((REPO / "grants").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ProjectionGrant":
                assert _server_accepts(custom_objects, doc) is None, path
            elif doc and doc.get("kind") == "ProjectionExport":
                assert _server_accepts_export(custom_objects, doc, export_namespace) is None, path


def test_the_corpus_is_broad() -> None:
    assert len(BAD_GRANTS) >= 25
    assert len({g.field for g in BAD_GRANTS}) >= 15, "the corpus should cover many fields"


@pytest.mark.parametrize("bad", BAD_GRANTS, ids=str)
def test_the_api_server_refuses_each_malformed_grant_naming_the_field(
    custom_objects: client.CustomObjectsApi, bad: BadGrant
) -> None:
    """Applied for real (not a dry run), as `kubectl apply` would: strict field validation."""
    doc = yaml.safe_load(bad.path.read_text())
    doc["metadata"]["name"] = unique_name(f"bad-{bad}")
    try:
        custom_objects.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, doc, field_validation="Strict"
        )
    except client.ApiException as e:
        assert e.status == bad.status, e.body
        message = json.loads(e.body or "{}")["message"]
    else:
        custom_objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, doc["metadata"]["name"])
        pytest.fail(f"the API server accepted {bad.path.name}")
    assert f"{bad.field}" in message, message
    assert bad.message in message, message


@pytest.fixture(scope="module")
def corpus_run() -> subprocess.CompletedProcess[str]:
    return validate(CORPUS.relative_to(REPO))


def test_validate_refuses_the_whole_corpus(corpus_run: subprocess.CompletedProcess[str]) -> None:
    assert corpus_run.returncode == 1, corpus_run.stdout + corpus_run.stderr
    assert (
        f"{len(BAD_GRANTS)} ProjectionGrant(s), 0 ProjectionExport(s) in {len(BAD_GRANTS)} file(s)"
    ) in corpus_run.stderr


@pytest.mark.parametrize("bad", BAD_GRANTS, ids=str)
def test_validate_refuses_each_malformed_grant_naming_the_field(
    corpus_run: subprocess.CompletedProcess[str], bad: BadGrant
) -> None:
    prefix = f"{bad.relative}:"
    errors = [x for x in corpus_run.stdout.splitlines() if x.startswith(prefix)]
    assert errors, f"validate accepted {bad.path.name}:\n{corpus_run.stdout}"
    fields = [x.split(": ", 2)[1] for x in errors]
    named = [x for x, f in zip(errors, fields, strict=True) if f.startswith(bad.field)]
    assert named, f"no error names {bad.field}: {errors}"
    assert any(bad.message in x and bad.validate in x for x in named), named


@pytest.mark.parametrize("bad", BAD_GRANTS, ids=str)
def test_the_controller_refuses_each_malformed_spec_too(bad: BadGrant) -> None:
    """parse_grant re-checks what it relies on, for grants stored before a CRD rule existed."""
    doc = yaml.safe_load(bad.path.read_text())
    if bad.controller_accepts:
        parse_grant(doc)  # harmless to the controller, and said why in the file
        return
    with pytest.raises(InvalidGrant):
        parse_grant(doc)


def test_a_selector_grant_over_a_source_open_to_any_namespace_is_warned_about(
    tmp_path: Path,
) -> None:
    """Consent a tenant could give itself (issue 36): a warning, not an error (exit 0)."""
    (tmp_path / "pack.yaml").write_text(
        """
apiVersion: v1
kind: Secret
metadata:
  name: hub
  namespace: jupyterhub
  labels: {projector.nebari.dev/export: "true"}
  annotations: {projector.nebari.dev/export-to: "*"}
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
metadata: {name: by-name}
spec:
  source: {namespace: jupyterhub, name: hub}
  target: {namespaces: [dask-gateway]}
"""
    )
    result = validate(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "ProjectionGrant by-label" in warned[0], result.stderr
    assert "'*'" in warned[0] and "docs/security.md" in warned[0]


# --- ProjectionExports ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export_namespace(core_v1: client.CoreV1Api) -> Iterator[str]:
    """Where this module's exports are sent (each document's own namespace is replaced)."""
    name = unique_name("validate-exports")
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core_v1.delete_namespace(name)


def _as_export(doc: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "name": name, "namespace": namespace}}


def _server_accepts_export(
    custom: client.CustomObjectsApi, doc: dict[str, Any], namespace: str
) -> str | None:
    """A strict dry-run create in `namespace`, under a fresh name."""
    try:
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            EXPORTS,
            _as_export(doc, namespace, unique_name("validate-dry-run")),
            dry_run="All",
            field_validation="Strict",
        )
    except client.ApiException as e:
        return str(e.body)
    return None


@pytest.mark.parametrize("bad", BAD_EXPORTS, ids=str)
def test_the_api_server_refuses_each_malformed_export_naming_the_field(
    custom_objects: client.CustomObjectsApi, export_namespace: str, bad: BadGrant
) -> None:
    """A dry run and a real create (as `kubectl apply` sends it): refused, with the field and
    the CRD's message, or the server's own words for the refusal validate words its way."""
    doc = yaml.safe_load(bad.path.read_text())
    assert _server_accepts_export(custom_objects, doc, export_namespace) is not None
    name = unique_name(f"bad-{bad}")
    try:
        custom_objects.create_namespaced_custom_object(
            GROUP,
            VERSION,
            export_namespace,
            EXPORTS,
            _as_export(doc, export_namespace, name),
            field_validation="Strict",
        )
    except client.ApiException as e:
        assert e.status == bad.status, e.body
        message = json.loads(e.body or "{}")["message"]
    else:
        custom_objects.delete_namespaced_custom_object(
            GROUP, VERSION, export_namespace, EXPORTS, name
        )
        pytest.fail(f"the API server accepted {bad.path.name}")
    assert bad.field in message, message
    assert bad.message in message and bad.server in message, message


def test_the_api_server_accepts_the_good_exports_and_the_grant_beside_them(
    custom_objects: client.CustomObjectsApi, export_namespace: str
) -> None:
    kinds = []
    for path in sorted(GOOD_EXPORTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "ProjectionExport":
                refused = _server_accepts_export(custom_objects, doc, export_namespace)
                assert refused is None, f"{path.name}: {refused}"
            elif doc["kind"] == "ProjectionGrant":
                assert _server_accepts(custom_objects, doc) is None, path.name
            kinds.append(doc["kind"])
    assert kinds.count("ProjectionExport") >= 4 and "ProjectionGrant" in kinds


def test_validate_refuses_every_bad_export_beside_the_bad_grants_with_file_and_line() -> None:
    """One command over both corpora and the good exports: each document checked against its
    own kind's CRD, every error reported, each pinned at its file:line, the kinds counted."""
    run = validate(EXPORTS_CORPUS.relative_to(REPO), GOOD_EXPORTS.relative_to(REPO), CORPUS)
    assert run.returncode == 1, run.stdout + run.stderr
    errors = sum(b.errors for b in BAD_EXPORTS) + sum(g.errors for g in BAD_GRANTS)
    assert len(run.stdout.splitlines()) == errors, run.stdout
    for bad in BAD_EXPORTS:
        expected = f"{bad.relative}:{bad.line}: {bad.field}: "
        hits = [x for x in run.stdout.splitlines() if x.startswith(expected)]
        assert hits and any((bad.validate or bad.message) in x for x in hits), (bad, run.stdout)
    good = [
        doc["kind"]
        for f in GOOD_EXPORTS.glob("*.yaml")
        for doc in yaml.safe_load_all(f.read_text())
    ]
    grants = len(BAD_GRANTS) + good.count("ProjectionGrant")
    exports = len(BAD_EXPORTS) + good.count("ProjectionExport")
    files = len(BAD_GRANTS) + len(BAD_EXPORTS) + len(list(GOOD_EXPORTS.glob("*.yaml")))
    summary = f"{grants} ProjectionGrant(s), {exports} ProjectionExport(s) in {files} file(s)"
    assert f"{summary}: {errors} error(s)" in run.stderr, run.stderr
