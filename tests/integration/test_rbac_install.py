"""Installing the shipped RBAC for the tests: idempotent, and a manifest the server refuses fails.

The integration tier proves the shipped permissions sufficient only if what it installs is
the shipped manifest, as the server accepted it; a refusal swallowed here would let the tests
run with whatever an earlier run left behind.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.bed import kube
from tests.bed.controlplane.plane import ControlPlane


def test_the_shipped_rbac_installs_again_and_a_refused_manifest_fails_the_run(
    control_plane: ControlPlane, admin_client: client.ApiClient, tmp_path: Path
) -> None:
    for run in ("first", "again"):  # a plane reused by a second session: applied again
        assert kube.projector_kubeconfig(admin_client, tmp_path / run).exists()
    docs = list(yaml.safe_load_all((kube.RBAC / "rbac.yaml").read_text()))
    role = copy.deepcopy(next(d for d in docs if d and d["kind"] == "ClusterRole"))
    role["metadata"]["name"] = kube.unique_name("broken-rbac")
    role["rules"] = [{"apiGroups": [""], "resources": ["secrets"]}]  # no verbs: refused
    broken = tmp_path / "rbac"
    broken.mkdir()
    (broken / "rbac.yaml").write_text(yaml.safe_dump(role))
    with pytest.raises(client.ApiException) as err:
        kube.projector_kubeconfig(admin_client, tmp_path / "c", rbac=broken)
    assert err.value.status == 422
