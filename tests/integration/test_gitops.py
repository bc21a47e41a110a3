"""The Argo CD example (an app of apps) renders as Argo CD would, and cannot delete grants.

No Argo CD runs here: these tests render deploy/argocd/root.yaml's chart (deploy/argocd/apps)
with helm as Argo CD would, prove that its schema refuses the placeholder grants repository,
that the children are ordered, retried and finalized as documented, that the controller's Helm
values pass the chart's schema, and that the example grants folder is a kustomization whose
every resource passes `projector validate` and a server-side dry run on the real API server.
What Argo CD deletes when the controller's Application goes is proven on a real API server in
tests/integration/test_helm.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.bed.helm import chart
from tests.bed.kube import unique_name
from tests.bed.launcher import REPO, validate

ARGOCD = REPO / "deploy" / "argocd"
YOURS = "https://git.example.org/platform/grants.git"


def root() -> dict[str, Any]:
    doc = yaml.safe_load((ARGOCD / "root.yaml").read_text())
    assert doc["apiVersion"] == "argoproj.io/v1alpha1" and doc["kind"] == "Application"
    assert (REPO / doc["spec"]["source"]["path"]).is_dir()
    return dict(doc)


def shipped_values(repo: str | None = None) -> dict[str, Any]:
    """The root Application's values, with the grants repository set to `repo` if given."""
    values = dict(root()["spec"]["source"]["helm"]["valuesObject"])
    if repo is not None:
        values["grants"] = {**values["grants"], "repoURL": repo}
    return values


def children(values: dict[str, Any], tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The child Applications, rendered from the root's chart as Argo CD would."""
    app = root()
    file = tmp_path / "root-values.yaml"
    file.write_text(yaml.safe_dump(values))
    rendered = chart.helm(
        chart.helm_binary(),
        "template",
        app["spec"]["source"]["helm"]["releaseName"],
        str(REPO / app["spec"]["source"]["path"]),
        "--namespace",
        app["spec"]["destination"]["namespace"],
        f"--values={file}",
    )
    return {d["metadata"]["name"]: d for d in chart.documents(rendered)}


@pytest.mark.parametrize("repo", [None, "", "https://github.com/nebari-dev/projector.git"], ids=str)
def test_the_root_application_refuses_to_render_until_the_grants_repository_is_set(
    repo: str | None, tmp_path: Path
) -> None:
    """As shipped (the placeholder), empty, or this project's own demo grants: refused."""
    with pytest.raises(RuntimeError, match="repoURL"):
        children(shipped_values(repo), tmp_path)


def test_the_children_are_ordered_retried_and_cannot_delete_grants(tmp_path: Path) -> None:
    apps = children(shipped_values(YOURS), tmp_path)
    assert set(apps) == {"projector", "projection-grants"}
    controller, grants = apps["projector"], apps["projection-grants"]
    wave = "argocd.argoproj.io/sync-wave"
    assert int(controller["metadata"]["annotations"][wave]) < int(
        grants["metadata"]["annotations"][wave]
    )
    for app in (controller, grants, root()):
        assert app["spec"]["syncPolicy"]["retry"]["limit"] >= 1
    assert grants["spec"]["source"]["repoURL"] == YOURS
    # Deleting the grants Application (or the root) leaves the grants; a grant gone from Git
    # is not pruned unless the user turns it on.
    assert "finalizers" not in grants["metadata"] and "finalizers" not in root()["metadata"]
    assert grants["spec"]["syncPolicy"]["automated"]["prune"] is False


def test_the_controller_application_renders_with_its_values_and_keeps_the_crd(
    tmp_path: Path,
) -> None:
    apps = children(shipped_values(YOURS), tmp_path)
    source = apps["projector"]["spec"]["source"]
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
            apps["projector"]["spec"]["destination"]["namespace"],
            "--include-crds",  # as Argo CD renders a chart: its crds/ are resources of the app
            f"--values={values}",
        )
    )
    kinds = {d["kind"]: d for d in rendered}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole"} <= set(kinds)
    annotations = kinds["CustomResourceDefinition"]["metadata"]["annotations"]
    options = set(annotations["argocd.argoproj.io/sync-options"].split(","))
    assert {"Prune=false", "Delete=false"} <= options
    assert annotations["helm.sh/resource-policy"] == "keep"


def test_the_example_grants_folder_is_a_valid_kustomization(
    custom_objects: client.CustomObjectsApi,
) -> None:
    """What a user's grants repository holds, as this project's grants/ shows it."""
    folder = REPO / shipped_values()["grants"]["path"]
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
