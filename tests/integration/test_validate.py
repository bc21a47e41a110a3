"""`projector validate` against the real API server: it must refuse what the server refuses.

Every bad fixture is refused by validate (with file:line, the field and the CRD's message) and
by the API server (a strict dry-run create); every grant in grants/ passes both. validate reads
the CRD itself, so a rule added to the CRD is enforced offline too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.launcher import REPO
from tests.support import unique_name

FIXTURES = REPO / "tests" / "fixtures" / "grants"
GROUP, VERSION, PLURAL = "projector.nebari.dev", "v1alpha1", "projectiongrants"

# fixture -> (line, field, part of the message); each message is the CRD's own
BAD = {
    "no-target.yaml": (7, "spec.target", "target needs namespaces or namespaceSelector"),
    "duplicate-to.yaml": (7, "spec.keys", "keys[].to must be unique"),
    "reserved-label.yaml": (9, "spec.target.labels", "may not use projector.nebari.dev/ keys"),
    "dotdot-key.yaml": (8, "spec.keys[0]", "may not be '.' or start with '..'"),
    "bad-policy.yaml": (10, "spec.policy.onRevoke", "'Shred' is not one of Delete, Retain"),
    "unknown-field.yaml": (9, "spec.target.namespace", "unknown field"),
    "bad-names.yaml": (6, "spec.source.namespace", "'JupyterHub' does not match"),
    "missing-source.yaml": (5, "spec", "'source' is a required property"),
}


def validate(*paths: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projector", "validate", *map(str, paths)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_shipped_grants_pass() -> None:
    result = validate("grants/")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 ProjectionGrant(s)" in result.stderr and "ok" in result.stderr


@pytest.fixture(scope="module")
def bad_run() -> subprocess.CompletedProcess[str]:
    """One run over the bad fixtures and the good grants: every error is reported, exit 1."""
    return validate(FIXTURES / "bad", "grants/")


def test_every_error_of_a_directory_is_reported_and_the_exit_is_1(
    bad_run: subprocess.CompletedProcess[str],
) -> None:
    assert bad_run.returncode == 1
    assert len(bad_run.stdout.splitlines()) == len(BAD) + 1  # bad-names has two errors
    assert "10 ProjectionGrant(s) in 14 file(s): 9 error(s)" in bad_run.stderr


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_grant_is_refused_with_file_line_field_and_message(
    bad_run: subprocess.CompletedProcess[str], name: str
) -> None:
    line, field, message = BAD[name]
    expected = f"tests/fixtures/grants/bad/{name}:{line}: {field}: "
    hits = [x for x in bad_run.stdout.splitlines() if expected in x]
    assert hits and message in hits[0], bad_run.stdout


def test_yaml_errors_wrong_versions_and_missing_files_fail() -> None:
    broken = validate(FIXTURES / "not-yaml.yaml")
    assert broken.returncode == 1 and "not-yaml.yaml:5: (yaml):" in broken.stdout
    wrong = validate(FIXTURES / "wrong-version.yaml")
    assert wrong.returncode == 1
    assert "wrong-version.yaml:1: apiVersion: must be one of: projector.nebari.dev/v1alpha1" in (
        wrong.stdout
    )
    missing = validate(FIXTURES / "no-such-file.yaml")
    assert missing.returncode == 1 and "no-such-file.yaml:0: (file):" in missing.stdout
    nothing = validate(REPO / "deploy" / "kustomization.yaml")
    assert nothing.returncode == 1 and "no ProjectionGrant found" in nothing.stderr


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
    result = subprocess.run(
        [sys.executable, "-m", "projector", "validate", f"--crd={path}", str(grant)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
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


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_api_server_refuses_the_same_bad_grants(
    custom_objects: client.CustomObjectsApi, name: str
) -> None:
    doc = yaml.safe_load((FIXTURES / "bad" / name).read_text())
    refused = _server_accepts(custom_objects, doc)
    assert refused is not None, f"the API server accepted {name}, validate refuses it"


def test_the_api_server_accepts_the_shipped_grants(custom_objects: client.CustomObjectsApi) -> None:
    for path in sorted((REPO / "grants").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ProjectionGrant":
                assert _server_accepts(custom_objects, doc) is None, path
