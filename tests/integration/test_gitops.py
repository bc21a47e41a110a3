"""The Argo CD examples point at what exists, and what they point at renders and validates.

No Argo CD runs here: these tests prove that each Application's path is in the repository,
that the controller's Helm values pass the chart's schema (helm template with them), and that
the grants folder is a kustomization whose every resource passes `projector validate` and a
server-side dry run on the real API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.helm import chart
from tests.launcher import REPO, validate
from tests.support import unique_name

ARGOCD = REPO / "deploy" / "argocd"


def application(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ARGOCD / name).read_text())
    assert doc["apiVersion"] == "argoproj.io/v1alpha1" and doc["kind"] == "Application"
    assert (REPO / doc["spec"]["source"]["path"]).is_dir()
    return dict(doc)


def test_the_controller_application_renders_with_its_values(tmp_path: Path) -> None:
    app = application("projector.yaml")
    source = app["spec"]["source"]
    assert source["path"] == "deploy/helm/projector"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(source["helm"]["valuesObject"]))
    rendered = chart.documents(
        chart.helm(
            chart.helm_binary(),
            "template",
            source["helm"]["releaseName"],
            str(REPO / source["path"]),
            "--namespace",
            app["spec"]["destination"]["namespace"],
            "--include-crds",
            f"--values={values}",
        )
    )
    kinds = {d["kind"] for d in rendered}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole"} <= kinds


def test_the_grants_application_is_a_valid_kustomization(
    custom_objects: client.CustomObjectsApi,
) -> None:
    app = application("grants.yaml")
    folder = REPO / app["spec"]["source"]["path"]
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    files = [folder / r for r in kustomization["resources"]]
    assert files and all(f.is_file() for f in files)
    result = validate(*files)
    assert result.returncode == 0, result.stdout + result.stderr
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            # a fresh name: other tests (the demo) may hold the shipped names right now
            doc["metadata"]["name"] = unique_name("gitops-dry-run")
            custom_objects.create_cluster_custom_object(
                "projector.nebari.dev",
                "v1alpha1",
                "projectiongrants",
                doc,
                dry_run="All",
                field_validation="Strict",
            )
