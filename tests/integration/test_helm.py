"""The Helm chart and the manifests generated from it, proven with helm and a real API server.

helm is built from its Go module (tests/bed/helm/build.sh). The install tests run on a second,
fresh control plane started without the CRD, as a new user's cluster is: Helm installs the CRD
from the chart's crds/, and the release is `projector` in `projector-system`, as the docs say.
There is no kubelet, so no pod runs; instead the controller runs here as the chart's own
ServiceAccount (a TokenRequest token), which proves that the chart's RBAC (and its optional
admission policy) let it project a Secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic

import projector
from tests.bed.controlplane.plane import CONTROLLER_MANAGER, ControlPlane
from tests.bed.helm import chart
from tests.bed.kube import (
    PF_LEVEL,
    api_client,
    eventually,
    priority_levels,
    token_kubeconfig,
)
from tests.bed.launcher import REPO, ControllerProcess, launch
from tests.bed.observability import rules
from tests.integration import test_big_secrets as big_secrets
from tests.support import Canaries, Cluster

RELEASE, NAMESPACE = chart.RELEASE, chart.NAMESPACE
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
CRD_NAME = "projectiongrants.projector.nebari.dev"
ALL_ON = [
    "--set=metrics.serviceMonitor.enabled=true",
    "--set=metrics.prometheusRule.enabled=true",
    "--set=metrics.dashboard.enabled=true",
    "--set=admissionPolicy.enabled=true",
    "--set=replicaCount=3",
    "--set=image.digest=sha256:" + "a" * 64,
    "--set=controller.workers=8",
    "--set=networkPolicy.egress[0].ports[0].port=443",
    "--set=tracing.otlpEndpoint=http://127.0.0.1:4318",
    "--set=tracing.samplerRatio=0.25",
]


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return chart.helm_binary()


def render(helm_bin: Path, *args: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs = chart.documents(chart.template(helm_bin, *args))
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def container(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    spec = docs[("Deployment", "projector")]["spec"]["template"]["spec"]
    assert len(spec["containers"]) == 1
    return dict(spec["containers"][0])


# --- offline: lint, template, schema, generated files -------------------------------------------


def test_chart_lints_strictly_with_default_and_optional_values(helm_bin: Path) -> None:
    chart.helm(helm_bin, "lint", "--strict", str(chart.CHART))
    chart.helm(helm_bin, "lint", "--strict", str(chart.CHART), *ALL_ON)


def test_template_default_values_is_restricted_and_highly_available(helm_bin: Path) -> None:
    docs = render(helm_bin)
    kinds = sorted(k for k, _ in docs)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",  # projector-metrics-reader
            "ClusterRole",  # projector-exports-edit, aggregated into admin and edit
            "ClusterRole",  # projector-exports-view, aggregated into view
            "ClusterRoleBinding",
            "Deployment",
            "FlowSchema",
            "FlowSchema",  # projector-leader-election
            "NetworkPolicy",
            "PodDisruptionBudget",
            "PriorityLevelConfiguration",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    deploy = docs[("Deployment", "projector")]
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        isinstance(pod["securityContext"]["runAsUser"], int)
        and pod["securityContext"]["runAsUser"] > 0
    )
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(docs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert "--leader-elect" in c["args"] and f"--namespace={NAMESPACE}" in c["args"]
    assert c["image"].endswith(f":{projector.__version__}")
    assert docs[("PodDisruptionBudget", "projector")]["spec"]["maxUnavailable"] == 1
    # Least privilege: Events only in `default`, the Lease only by name.
    events = docs[("Role", "projector-events")]
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}
    ]
    lease = docs[("Role", "projector")]["rules"]
    assert {"get", "update"} == set(next(r for r in lease if r.get("resourceNames"))["verbs"])
    cluster_rules = docs[("ClusterRole", "projector")]["rules"]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in cluster_rules)
    verbs = {res: set(r["verbs"]) for r in cluster_rules for res in r["resources"]}
    assert verbs["projectiongrants/status"] == {"patch"}  # nothing reads or PUTs a status
    assert verbs["namespaces"] == {"list", "watch"}  # namespaces come from the informer only
    # no client-side rate limit: API Priority and Fairness bounds it, in a level of its own
    assert "--qps=0" in c["args"]
    level = docs[("PriorityLevelConfiguration", "projector")]["spec"]["limited"]
    assert level["borrowingLimitPercent"] == 0 and level["limitResponse"]["type"] == "Queue"
    schema = docs[("FlowSchema", "projector")]["spec"]
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": "projector"}}
    subject["serviceAccount"]["namespace"] = NAMESPACE
    assert schema["priorityLevelConfiguration"] == {"name": "projector"}
    assert schema["rules"][0]["subjects"] == [subject]
    election = docs[("FlowSchema", "projector-leader-election")]["spec"]
    assert election["priorityLevelConfiguration"] == {"name": "leader-election"}
    assert election["matchingPrecedence"] < schema["matchingPrecedence"]
    assert election["rules"][0]["subjects"] == [subject]
    off = render(helm_bin, "--set=flowControl.enabled=false")
    assert not {k for k, _ in off} & {"FlowSchema", "PriorityLevelConfiguration"}


def test_template_non_default_values(helm_bin: Path) -> None:
    docs = render(helm_bin, *ALL_ON)
    for kind in (
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ):
        assert any(k == kind for k, _ in docs), kind
    c = container(docs)
    assert c["image"] == "ghcr.io/nebari-dev/projector@sha256:" + "a" * 64
    assert "--workers=8" in c["args"]
    assert docs[("Deployment", "projector")]["spec"]["replicas"] == 3
    dashboard = docs[("ConfigMap", "projector-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["projector.json"])["panels"]
    assert any("projector_projection_latency_seconds_bucket" in json.dumps(p) for p in panels)
    netpol = docs[("NetworkPolicy", "projector")]["spec"]
    assert netpol["policyTypes"] == ["Ingress", "Egress"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == (
        "parentbased_traceidratio",
        "0.25",
    )
    assert not any(e["name"].startswith("OTEL_") for e in container(render(helm_bin))["env"])
    single = render(helm_bin, "--set=leaderElection.enabled=false", "--set=replicaCount=1")
    args = container(single)["args"]
    assert "--no-leader-elect" in args and "--leader-elect" not in args


def test_metrics_are_https_for_the_metrics_reader_and_plain_only_when_asked(
    helm_bin: Path,
) -> None:
    """Secure by default: /metrics on its own port, the probes on `http`; the controller may
    review tokens; a scraper needs `<release>-metrics-reader`; the ServiceMonitor scrapes over
    HTTPS with Prometheus's token. metrics.secure=false takes all of that away."""
    docs = render(helm_bin, "--set=metrics.serviceMonitor.enabled=true")
    c = container(docs)
    assert {"--http-port=8080", "--metrics-port=8443"} <= set(c["args"])
    assert not any(a.startswith(("--no-metrics-secure", "--metrics-cert-dir")) for a in c["args"])
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [
        ("metrics", 8443),
        ("http", 8080),
    ]
    assert c["livenessProbe"]["httpGet"]["port"] == c["readinessProbe"]["httpGet"]["port"] == "http"
    service = docs[("Service", "projector-metrics")]["spec"]["ports"]
    assert service == [
        {"name": "metrics", "port": 8443, "targetPort": "metrics", "protocol": "TCP"}
    ]
    ingress = docs[("NetworkPolicy", "projector")]["spec"]["ingress"][0]["ports"]
    assert {p["port"] for p in ingress} == {"metrics", "http"}
    reviews = [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["subjectaccessreviews"],
            "verbs": ["create"],
        },
    ]
    assert all(r in docs[("ClusterRole", "projector")]["rules"] for r in reviews)
    reader = docs[("ClusterRole", "projector-metrics-reader")]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert ("ClusterRoleBinding", "projector-metrics-reader") not in docs  # metrics.readers: []
    (endpoint,) = docs[("ServiceMonitor", "projector")]["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}

    certified = render(
        helm_bin,
        "--set=metrics.serviceMonitor.enabled=true",
        "--set=metrics.certSecret=projector-metrics-tls",
        "--set=metrics.readers[0].kind=ServiceAccount",
        "--set=metrics.readers[0].name=prometheus",
        "--set=metrics.readers[0].namespace=monitoring",
        "--set=metrics.serviceMonitor.authorization.credentials.name=scraper",
        "--set=metrics.serviceMonitor.authorization.credentials.key=token",
    )
    c = container(certified)
    assert "--metrics-cert-dir=/etc/projector/metrics-tls" in c["args"]
    assert {"name": "metrics-tls", "mountPath": "/etc/projector/metrics-tls", "readOnly": True} in (
        c["volumeMounts"]
    )
    pod = certified[("Deployment", "projector")]["spec"]["template"]["spec"]
    assert {"name": "metrics-tls", "secret": {"secretName": "projector-metrics-tls"}} in pod[
        "volumes"
    ]
    (endpoint,) = certified[("ServiceMonitor", "projector")]["spec"]["endpoints"]
    assert endpoint["authorization"] == {"credentials": {"name": "scraper", "key": "token"}}
    assert "bearerTokenFile" not in endpoint
    assert endpoint["tlsConfig"] == {
        "serverName": "projector-metrics.projector-system.svc",
        "ca": {"secret": {"name": "projector-metrics-tls", "key": "ca.crt"}},
    }
    binding = certified[("ClusterRoleBinding", "projector-metrics-reader")]
    assert binding["roleRef"]["name"] == "projector-metrics-reader"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    ]

    plain = render(
        helm_bin, "--set=metrics.serviceMonitor.enabled=true", "--set=metrics.secure=false"
    )
    assert "--no-metrics-secure" in container(plain)["args"]
    assert ("ClusterRole", "projector-metrics-reader") not in plain
    assert not any(r in plain[("ClusterRole", "projector")]["rules"] for r in reviews)
    (endpoint,) = plain[("ServiceMonitor", "projector")]["spec"]["endpoints"]
    assert "scheme" not in endpoint and "tlsConfig" not in endpoint


def test_rollouts_are_off_by_default_and_only_enabling_them_grants_access_to_workloads(
    helm_bin: Path,
) -> None:
    off = render(helm_bin)
    assert "--rollouts" not in container(off)["args"]
    for (kind, name), doc in off.items():
        for rule in doc.get("rules", []) if kind in ("ClusterRole", "Role") else []:
            assert "apps" not in rule.get("apiGroups", []), (name, rule)
    on = render(helm_bin, "--set=rollouts.enabled=true")
    assert "--rollouts" in container(on)["args"]
    added = {
        ("ClusterRole", "projector-rollouts"),
        ("ClusterRoleBinding", "projector-rollouts"),
        ("ValidatingAdmissionPolicy", "projector-rollout-annotations-only"),
        ("ValidatingAdmissionPolicyBinding", "projector-rollout-annotations-only"),
    }
    assert set(on) - set(off) == added
    assert on[("ClusterRole", "projector-rollouts")]["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments", "statefulsets", "daemonsets"],
            "verbs": ["get", "list", "watch", "patch"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    binding = on[("ClusterRoleBinding", "projector-rollouts")]
    assert binding["roleRef"]["name"] == "projector-rollouts"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "projector", "namespace": NAMESPACE}
    ]
    # nothing else changes: the other documents are the same, the Deployment but for the flag
    for key in set(off) - {("Deployment", "projector")}:
        assert on[key] == off[key], key
    args_on = container(on)["args"]
    assert [a for a in args_on if a != "--rollouts"] == container(off)["args"]
    chart.helm(helm_bin, "lint", "--strict", str(chart.CHART), "--set=rollouts.enabled=true")


def test_the_chart_renders_the_generated_rules_with_the_selector_and_runbook_from_values(
    helm_bin: Path,
) -> None:
    """The chart's PrometheusRule is tests/bed/observability/rules.py's groups, not a copy: with the
    defaults, exactly deploy/prometheus/rules.yaml; the job selector and runbook base from
    values, never from the release name."""
    on = "--set=metrics.prometheusRule.enabled=true"
    default = render(helm_bin, on)[("PrometheusRule", "projector")]
    shipped = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules.yaml").read_text())
    assert default["spec"]["groups"] == shipped["groups"] == rules.groups()
    other = chart.documents(
        chart.helm(
            helm_bin,
            "template",
            "another-release",
            str(chart.CHART),
            on,
            '--set-string=metrics.prometheusRule.selector=job=~"projector|dr"',
            "--set=metrics.runbookBaseURL=https://runbooks.example.org/projector/",
            "--set=metrics.grafanaURL=https://grafana.example.org",
        )
    )
    rule = next(d for d in other if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == rules.groups(
        'job=~"projector|dr"',
        "https://runbooks.example.org/projector",
        "https://grafana.example.org",
    )
    annotations = rule["spec"]["groups"][1]["rules"][0]["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url", "dashboard_url"}
    assert annotations["dashboard_url"] == "https://grafana.example.org/d/projector/projector"
    monitor = render(helm_bin, "--set=metrics.serviceMonitor.enabled=true")
    assert monitor[("ServiceMonitor", "projector")]["spec"]["jobLabel"] == "app.kubernetes.io/name"


@pytest.mark.parametrize(
    "value, error",
    [
        ("securityContext.readOnlyRootFilesystem=false", "readOnlyRootFilesystem"),
        ("securityContext.allowPrivilegeEscalation=true", "allowPrivilegeEscalation"),
        ("podSecurityContext.runAsUser=0", "runAsUser"),
        ("replicaCount=-1", "replicaCount"),
        ("noSuchValue=1", "noSuchValue"),
        ("leaderElection.enabled=false", "/replicaCount': maximum: got 2, want 1"),
        ("tracing.samplerRatio=2", "samplerRatio"),
        ("podSecurityContext.seccompProfile.type=Unconfined", "seccompProfile/type"),
        ("securityContext.seccompProfile.type=Unconfined", "seccompProfile/type"),
        ("podSecurityContext.runAsGroup=0", "runAsGroup"),
        ("podSecurityContext.fsGroup=0", "fsGroup"),
        ("securityContext.runAsUser=0", "runAsUser"),
        ("securityContext.runAsGroup=0", "runAsGroup"),
        ("securityContext.privileged=true", "privileged"),
        ("securityContext.capabilities.add[0]=NET_ADMIN", "capabilities/add"),
        ("probes.liveness.successThreshold=2", "successThreshold"),
        ("strategy.type=Sideways", "strategy/type"),
    ],
)
def test_values_schema_refuses_unsafe_or_unknown_values(
    helm_bin: Path, value: str, error: str
) -> None:
    with pytest.raises(RuntimeError, match=error):
        chart.template(helm_bin, f"--set={value}")


OPERATOR_VALUES = [
    "--set=commonLabels.team=platform",
    "--set=commonLabels.cost-center=c42",
    "--set=revisionHistoryLimit=2",
    "--set=strategy.type=RollingUpdate",
    "--set=strategy.rollingUpdate.maxUnavailable=0",
    "--set=strategy.rollingUpdate.maxSurge=1",
    "--set=topologySpreadConstraints[0].maxSkew=1",
    "--set=topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
    "--set=topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    "--set=topologySpreadConstraints[0].labelSelector.matchLabels.app\\.kubernetes\\.io/name=projector",
    "--set=probes.liveness.periodSeconds=20",
    "--set=probes.liveness.failureThreshold=6",
    "--set=probes.liveness.initialDelaySeconds=3",
    "--set=probes.readiness.periodSeconds=2",
    "--set=probes.readiness.timeoutSeconds=1",
    "--set=extraVolumes[0].name=otel-ca",
    "--set=extraVolumes[0].configMap.name=otel-ca",
    "--set=extraVolumeMounts[0].name=otel-ca",
    "--set=extraVolumeMounts[0].mountPath=/etc/otel-ca",
    "--set=extraVolumeMounts[0].readOnly=true",
]


def test_operator_values_land_where_kubernetes_reads_them(helm_bin: Path) -> None:
    """Spread, probes, volumes, strategy, history and common labels: each in its field, and
    common labels on every object and the pods but never in a selector."""
    defaults = render(helm_bin)
    docs = render(helm_bin, *OPERATOR_VALUES, *ALL_ON)
    deploy = docs[("Deployment", "projector")]["spec"]
    pod = deploy["template"]["spec"]
    assert deploy["revisionHistoryLimit"] == 2
    assert deploy["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "projector"}},
        }
    ]
    assert pod["volumes"] == [{"name": "otel-ca", "configMap": {"name": "otel-ca"}}]
    c = container(docs)
    assert c["volumeMounts"] == [{"name": "otel-ca", "mountPath": "/etc/otel-ca", "readOnly": True}]
    live, ready = c["livenessProbe"], c["readinessProbe"]
    assert (live["periodSeconds"], live["failureThreshold"], live["initialDelaySeconds"]) == (
        20,
        6,
        3,
    )
    assert live["timeoutSeconds"] == 5  # the default of what was not overridden
    assert (ready["periodSeconds"], ready["timeoutSeconds"], ready["failureThreshold"]) == (2, 1, 2)
    for (kind, name), doc in docs.items():
        assert doc["metadata"]["labels"]["team"] == "platform", (kind, name)
    assert deploy["template"]["metadata"]["labels"]["cost-center"] == "c42"
    selectors = [deploy["selector"], docs[("PodDisruptionBudget", "projector")]["spec"]["selector"]]
    selectors.append({"matchLabels": docs[("Service", "projector-metrics")]["spec"]["selector"]})
    assert all("team" not in s["matchLabels"] for s in selectors)
    # Unset, none of them is rendered, and Kubernetes' own defaults apply.
    default_pod = defaults[("Deployment", "projector")]["spec"]["template"]["spec"]
    assert "strategy" not in defaults[("Deployment", "projector")]["spec"]
    assert not {"topologySpreadConstraints", "volumes"} & set(default_pod)
    assert "volumeMounts" not in container(defaults)


def mib(quantity: str) -> float:
    """A memory quantity (Mi, Gi, or bytes) in MiB."""
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20


def test_default_memory_covers_the_measured_rss(helm_bin: Path) -> None:
    """The request is at least the RSS measured at 1,000 grants and 10,000 copies (the memory
    benchmark's result), the limit the peak the big-Secrets test bounds, with a margin."""
    measured = json.loads((REPO / "benchmarks" / "results" / "memory.json").read_text())
    at_size = measured["systems"]["projector"]["rss_at_size"]["value"]
    resources = container(render(helm_bin))["resources"]
    assert mib(resources["requests"]["memory"]) >= at_size
    assert mib(resources["limits"]["memory"]) >= 1.5 * big_secrets.RSS_LIMIT_MIB


def test_generated_manifests_are_up_to_date(helm_bin: Path) -> None:
    stale = chart.stale(chart.render(helm_bin))
    assert not stale, f"stale generated files (run `make manifests`): {stale}"


# --- a fresh cluster: install.yaml dry-run, helm install / upgrade / uninstall ------------------


@pytest.fixture(scope="module")
def fresh_plane(binaries: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A second control plane without the CRD: what a new user's cluster looks like."""
    plane = ControlPlane(
        tmp_path_factory.mktemp("helm-plane"),
        binaries,
        crd_dir=None,
        die_with_parent=True,
        # for the chart's read-only ClusterRole, aggregated into view
        extra_args={CONTROLLER_MANAGER: ["--controllers=clusterrole-aggregation-controller"]},
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def fresh_api(fresh_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = api_client(fresh_plane.kubeconfig)
    yield api
    api.close()


def helm_on(helm_bin: Path, plane: ControlPlane, *args: str) -> str:
    # HOME too: client-go's discovery cache goes under $HOME/.kube, never the real home.
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "HOME": str(plane.root / "home")}
    env["HELM_CACHE_HOME"] = str(plane.root / "helm-cache")
    env["HELM_CONFIG_HOME"] = str(plane.root / "helm-config")
    env["HELM_DATA_HOME"] = str(plane.root / "helm-data")
    return chart.helm(helm_bin, *args, env=env)


def server_side_apply(api: client.ApiClient, doc: dict[str, Any], *, dry_run: bool) -> None:
    dyn = dynamic.DynamicClient(api)
    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    kwargs: dict[str, Any] = {"field_manager": "kubectl", "force_conflicts": True}
    if dry_run:
        kwargs["dry_run"] = "All"
    namespace = doc["metadata"].get("namespace")
    res.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=namespace, **kwargs)


def test_install_yaml_passes_a_server_side_dry_run_apply(
    fresh_api: client.ApiClient,
) -> None:
    docs = chart.documents((REPO / "deploy" / "install.yaml").read_text())
    assert [d["kind"] for d in docs[:2]] == ["Namespace", "CustomResourceDefinition"]
    core = client.CoreV1Api(fresh_api)
    # A dry-run creates nothing, so the objects in the namespace need it to exist for real
    # (as `kubectl apply --dry-run=server` does); it is left for the install test, harmlessly.
    server_side_apply(fresh_api, docs[0], dry_run=False)
    for doc in docs[1:]:
        server_side_apply(fresh_api, doc, dry_run=True)
    with pytest.raises(client.ApiException):  # the dry run really did not create anything
        core.read_namespaced_service_account("projector", NAMESPACE)


def test_operator_values_pass_a_server_side_dry_run(
    helm_bin: Path, fresh_api: client.ApiClient
) -> None:
    """The API server accepts the Deployment those values render (a liveness successThreshold
    other than 1, a mount without its volume, would be refused here)."""
    deploy = render(helm_bin, *OPERATOR_VALUES)[("Deployment", "projector")]
    core = client.CoreV1Api(fresh_api)
    with contextlib.suppress(client.ApiException):  # the install test may have made it already
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    server_side_apply(fresh_api, deploy, dry_run=True)
    broken = json.loads(json.dumps(deploy))
    broken["spec"]["template"]["spec"]["volumes"] = []
    with pytest.raises(client.ApiException, match="otel-ca"):
        server_side_apply(fresh_api, broken, dry_run=True)


def first_projection(
    k8s: Cluster,
    api: client.ApiClient,
    tmp_path: Path,
    namespaces: tuple[str, str],
    tag: str,
) -> tuple[str, ControllerProcess, Path]:
    """A new user's first projection, `src` -> `dst`, run by the chart's ServiceAccount and
    RBAC (no kubelet: no pod): the grant's name, the controller (started) and the
    ServiceAccount's kubeconfig; the source holds {"api-token": "CANARY-<tag>-1"}."""
    src, dst = namespaces
    for ns in namespaces:
        with contextlib.suppress(client.ApiException):  # already there
            k8s.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    k8s.source(src, "hub", {"api-token": f"CANARY-{tag}-1"}, export_to=dst)
    grant = k8s.grant((src, "hub"), name=f"{tag}-hub", namespaces=[dst])
    kubeconfig = token_kubeconfig(tmp_path / "sa.kubeconfig", api, RELEASE, NAMESPACE)
    return grant, launch(kubeconfig, tmp_path / "controller.log"), kubeconfig


def released_objects(api: client.ApiClient) -> list[str]:
    """Every object labelled with the release, of every kind the chart can create."""
    dyn = dynamic.DynamicClient(api)
    kinds = [
        ("apps/v1", "Deployment"),
        ("v1", "ServiceAccount"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
        ("policy/v1", "PodDisruptionBudget"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
        (FLOWCONTROL, "PriorityLevelConfiguration"),
        (FLOWCONTROL, "FlowSchema"),
    ]
    found = []
    for version, kind in kinds:
        for item in (
            dyn.resources.get(api_version=version, kind=kind).get(label_selector=INSTANCE).items
        ):
            found.append(f"{kind}/{item.metadata.namespace or ''}/{item.metadata.name}")
    return found


FLOWCONTROL = "flowcontrol.apiserver.k8s.io/v1"


def served_by(request: Callable[[], Any]) -> str:
    """The uid of the priority level that served `request` (a call answering its response)."""
    try:
        headers = request().headers
    except client.ApiException as e:  # a 404 is served by a level too
        headers = e.headers
    return str(headers[PF_LEVEL])


def run_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projector", *args, f"--kubeconfig={kubeconfig}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_helm_install_upgrade_uninstall_on_a_real_api_server(
    helm_bin: Path,
    fresh_plane: ControlPlane,
    fresh_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(fresh_api)
    apps = client.AppsV1Api(fresh_api)
    ext = client.ApiextensionsV1Api(fresh_api)
    canaries = Canaries()
    k8s = Cluster(core, client.CustomObjectsApi(fresh_api), canaries, "helm")
    chart_dir = str(chart.CHART)

    # install: every object accepted, the CRD established, the Deployment valid and as asked
    helm_on(
        helm_bin, fresh_plane, "install", RELEASE, chart_dir, "-n", NAMESPACE, "--create-namespace"
    )

    def established() -> bool:
        conds = ext.read_custom_resource_definition(CRD_NAME).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    eventually(established, message="CRD Established")
    manifest = chart.documents(
        helm_on(helm_bin, fresh_plane, "get", "manifest", RELEASE, "-n", NAMESPACE)
    )
    assert len(manifest) >= 11
    on_server = set(released_objects(fresh_api))
    for doc in manifest:
        ns = doc["metadata"].get("namespace", "")
        assert f"{doc['kind']}/{ns}/{doc['metadata']['name']}" in on_server, doc["kind"]
    deploy = apps.read_namespaced_deployment("projector", NAMESPACE)
    assert deploy.spec.replicas == 2
    assert deploy.spec.template.spec.containers[0].security_context.read_only_root_filesystem

    # a new user's first projection, by the chart's ServiceAccount and RBAC (no kubelet: no pod)
    src, dst = "jupyterhub", "dask-gateway"
    grant, ctl, kubeconfig = first_projection(k8s, fresh_api, tmp_path, (src, dst), "helm")
    try:
        eventually(ctl.ready, timeout=30, message="controller /readyz")
        eventually(lambda: k8s.copy_data(dst, "hub") == {"api-token": "CANARY-helm-1"})
        # API Priority and Fairness: its requests are served in its own bounded level, its
        # Lease requests in leader-election, as the chart's FlowSchemas say
        uids, as_sa = priority_levels(fresh_api), api_client(kubeconfig)
        secrets = client.CoreV1Api(as_sa).list_namespaced_secret
        assert served_by(lambda: secrets(dst, _preload_content=False)) == uids[RELEASE]
        lease = client.CoordinationV1Api(as_sa).read_namespaced_lease
        served = served_by(lambda: lease("projector-leader", NAMESPACE, _preload_content=False))
        assert served == uids["leader-election"]
        as_sa.close()
        explained = run_cli(fresh_plane.kubeconfig, "explain", grant)
        assert explained.returncode == 0, explained.stderr
        assert "projected" in explained.stdout and dst in explained.stdout
        canaries.assert_absent("explain", explained.stdout + explained.stderr)

        # upgrade with changed values: one replica, fewer workers, the admission policy and
        # the dashboard on
        helm_on(
            helm_bin,
            fresh_plane,
            "upgrade",
            RELEASE,
            chart_dir,
            "-n",
            NAMESPACE,
            "--set=replicaCount=1",
            "--set=controller.workers=2",
            "--set=admissionPolicy.enabled=true",
            "--set=metrics.dashboard.enabled=true",
        )
        deploy = apps.read_namespaced_deployment("projector", NAMESPACE)
        assert deploy.spec.replicas == 1
        assert "--workers=2" in (deploy.spec.template.spec.containers[0].args or [])
        cm = core.read_namespaced_config_map("projector-dashboard", NAMESPACE)
        assert cm.metadata.labels["grafana_dashboard"] == "1"

        # the policy: projector's ServiceAccount may write only Secrets with its label
        sa = client.CoreV1Api(api_client(kubeconfig))
        foreign = client.V1Secret(metadata=client.V1ObjectMeta(name="not-projectors"))

        def refused() -> bool:
            try:
                sa.create_namespaced_secret(dst, foreign)
            except client.ApiException as e:
                return e.status in (403, 422) and "managed-by=projector" in (e.body or "")
            sa.delete_namespaced_secret("not-projectors", dst)  # policy not loaded yet
            return False

        eventually(refused, message="admission policy refuses an unlabelled Secret")
        try:  # an admin's own Secret (a probe that landed just before the policy may be it)
            core.create_namespaced_secret(dst, foreign)
        except client.ApiException as e:
            if e.status != 409:
                raise

        def as_projector(change: Callable[[client.V1Secret], None]) -> Callable[[], object]:
            def update() -> object:  # a PUT: the verb projector's ClusterRole grants it
                obj = core.read_namespaced_secret("not-projectors", dst)
                change(obj)
                return sa.replace_namespaced_secret("not-projectors", dst, obj)

            return update

        def relabel(o: client.V1Secret) -> None:
            o.metadata.labels = {"projector.nebari.dev/managed-by": "projector"}

        def rewrite(o: client.V1Secret) -> None:
            o.data = {"x": "eA=="}

        for attempt in (  # neither delete, nor update, nor claim it by adding projector's label
            lambda: sa.delete_namespaced_secret("not-projectors", dst),
            as_projector(rewrite),
            as_projector(relabel),
        ):
            with pytest.raises(client.ApiException) as denied:
                attempt()
            assert denied.value.status in (403, 422), denied.value
            assert "managed-by=projector" in (denied.value.body or ""), denied.value.body
        assert not (core.read_namespaced_secret("not-projectors", dst).metadata.labels or {})

        # ... and ConfigMaps alike: never an unlabelled one, while its own ConfigMap copies land
        theirs = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="not-projectors"), data={"x": "1"}
        )
        core.create_namespaced_config_map(dst, theirs)

        def cm_as_projector(change: Callable[[client.V1ConfigMap], None]) -> Callable[[], object]:
            def update() -> object:
                obj = core.read_namespaced_config_map("not-projectors", dst)
                change(obj)
                return sa.replace_namespaced_config_map("not-projectors", dst, obj)

            return update

        def cm_rewrite(o: client.V1ConfigMap) -> None:
            o.data = {"x": "2"}

        def cm_relabel(o: client.V1ConfigMap) -> None:
            o.metadata.labels = {"projector.nebari.dev/managed-by": "projector"}

        fresh = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="unlabelled-new"))
        for attempt in (
            lambda: sa.delete_namespaced_config_map("not-projectors", dst),
            cm_as_projector(cm_rewrite),
            cm_as_projector(cm_relabel),
            lambda: sa.create_namespaced_config_map(dst, fresh),
        ):
            with pytest.raises(client.ApiException) as denied:
                attempt()
            assert denied.value.status in (403, 422), denied.value
            assert "managed-by=projector" in (denied.value.body or ""), denied.value.body
        kept = core.read_namespaced_config_map("not-projectors", dst)
        assert kept.data == {"x": "1"} and not (kept.metadata.labels or {})
        k8s.config_source(src, "endpoints", {"hub-url": "http://hub.CANARY-helm-3"}, export_to=dst)
        k8s.grant((src, "endpoints"), name="endpoints-to-dask", namespaces=[dst], kind="ConfigMap")
        want = {"hub-url": "http://hub.CANARY-helm-3"}
        eventually(lambda: k8s.config_data(dst, "endpoints") == want, message="own ConfigMap copy")

        k8s.patch_secret(src, "hub", {"data": {"api-token": "CANARY-helm-2"}})
        eventually(lambda: k8s.copy_data(dst, "hub") == {"api-token": "CANARY-helm-2"})
    finally:
        code = ctl.stop()
    assert code == 0, ctl.logs()[-3000:]
    canaries.assert_absent("controller logs", ctl.logs())
    k8s.scan()

    # uninstall: no object of the release is left; the copy stays (no finalizers), and so do
    # the CRD and the grants (Helm never deletes a chart's crds/: grants are the admins' data)
    helm_on(helm_bin, fresh_plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    eventually(lambda: released_objects(fresh_api) == [], message="release objects deleted")
    assert k8s.copy_data(dst, "hub") == {"api-token": "CANARY-helm-2"}
    assert not (k8s.copy(dst, "hub").metadata.finalizers or [])
    assert ext.read_custom_resource_definition(CRD_NAME)
    assert k8s.get_grant(grant)["metadata"].get("finalizers") is None
    listed = helm_on(helm_bin, fresh_plane, "list", "-A", "-o", "json")
    assert json.loads(listed) == []


# --- GitOps: what Argo CD deletes with the controller's Application, and the CRD upgrade step ---

ARGO_OPTIONS = "argocd.argoproj.io/sync-options"


def argo_rendered(helm_bin: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """The controller's Application as Argo CD renders it: the chart with the child's values
    (deploy/argocd/apps) and its crds/ included, as Argo CD's own helm template does."""
    apps = chart.documents(
        chart.helm(
            helm_bin,
            "template",
            "projector-platform",
            str(REPO / "deploy" / "argocd" / "apps"),
            "--namespace=argocd",
            "--set=grants.repoURL=https://git.example.org/platform/grants.git",
        )
    )
    app = next(a for a in apps if a["metadata"]["name"] == "projector")
    values = tmp_path / "argo-values.yaml"
    values.write_text(json.dumps(app["spec"]["source"]["helm"]["valuesObject"]))
    return chart.documents(chart.template(helm_bin, "--include-crds", f"--values={values}"))


def test_deleting_the_controller_application_as_argo_cd_would_leaves_crd_grants_and_copies(
    helm_bin: Path, fresh_api: client.ApiClient, tmp_path: Path
) -> None:
    """Argo CD syncs the controller's Application (the chart with its crds/), the controller
    projects; then the Application is deleted with its resources finalizer, which deletes every
    resource Argo CD manages except those whose sync-options say Delete=false."""
    core = client.CoreV1Api(fresh_api)
    ext = client.ApiextensionsV1Api(fresh_api)
    canaries = Canaries()
    k8s = Cluster(core, client.CustomObjectsApi(fresh_api), canaries, "argo")
    docs = argo_rendered(helm_bin, tmp_path)
    with contextlib.suppress(client.ApiException):  # CreateNamespace=true
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    for doc in docs:  # the sync: every resource server-side applied (ServerSideApply=true)
        server_side_apply(fresh_api, doc, dry_run=False)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(CRD_NAME).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    eventually(established, message="CRD Established")
    src, dst = "argo-producer", "argo-consumer"
    grant, ctl, _ = first_projection(k8s, fresh_api, tmp_path, (src, dst), "argo")
    try:
        eventually(lambda: k8s.copy_data(dst, "hub") == {"api-token": "CANARY-argo-1"})
    finally:
        assert ctl.stop() == 0, ctl.logs()[-3000:]
    canaries.assert_absent("controller logs", ctl.logs())

    # The Application deleted: Argo CD deletes what it manages, but for Delete=false.
    dyn = dynamic.DynamicClient(fresh_api)
    kept = []
    for doc in docs:
        options = (doc["metadata"].get("annotations") or {}).get(ARGO_OPTIONS, "")
        if "Delete=false" in options.split(","):
            kept.append(doc["kind"])
            continue
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        with contextlib.suppress(client.ApiException):
            res.delete(name=doc["metadata"]["name"], namespace=doc["metadata"].get("namespace"))
    assert kept == ["CustomResourceDefinition", "CustomResourceDefinition"]  # grants, exports
    eventually(lambda: released_objects(fresh_api) == [], message="the app's objects deleted")
    assert ext.read_custom_resource_definition(CRD_NAME)
    assert k8s.get_grant(grant)["metadata"]["name"] == grant
    assert k8s.copy_data(dst, "hub") == {"api-token": "CANARY-argo-1"}
    k8s.scan()


def test_the_documented_crd_upgrade_step_applies_a_changed_crd_and_keeps_the_grants(
    fresh_api: client.ApiClient,
) -> None:
    """Helm never upgrades crds/; docs/install.md's step, `kubectl apply --server-side
    --force-conflicts -f deploy/crds/`, does (here: the same server-side apply, by the field
    manager kubectl uses). The CRD is first made to look like an older release's (a printer
    column fewer, written by another manager, as `helm install` writes it)."""
    ext = client.ApiextensionsV1Api(fresh_api)
    custom = client.CustomObjectsApi(fresh_api)
    shipped = chart.documents((REPO / "deploy" / "crds" / chart.CRD_FILE).read_text())[0]
    current = ext.read_custom_resource_definition(CRD_NAME)
    older = fresh_api.sanitize_for_serialization(current)
    columns = older["spec"]["versions"][0]["additionalPrinterColumns"]
    older["spec"]["versions"][0]["additionalPrinterColumns"] = columns[:-1]
    ext.replace_custom_resource_definition(CRD_NAME, older, field_manager="helm")
    grants_before = {
        g["metadata"]["name"]
        for g in custom.list_cluster_custom_object(
            "projector.nebari.dev", "v1alpha1", "projectiongrants"
        )["items"]
    }
    server_side_apply(fresh_api, shipped, dry_run=False)  # the documented step
    after = fresh_api.sanitize_for_serialization(ext.read_custom_resource_definition(CRD_NAME))
    want = shipped["spec"]["versions"][0]["additionalPrinterColumns"]
    got = after["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in got] == [c["name"] for c in want]
    grants_after = {
        g["metadata"]["name"]
        for g in custom.list_cluster_custom_object(
            "projector.nebari.dev", "v1alpha1", "projectiongrants"
        )["items"]
    }
    assert grants_after == grants_before


def test_the_read_only_grants_role_is_aggregated_into_view_and_reads_no_secret(
    helm_bin: Path, fresh_api: client.ApiClient
) -> None:
    """Whoever holds `view` cluster-wide may read grants and their status, never write one,
    and gains no Secret read from projector's role (the kube-controller-manager's aggregation
    controller merges it into view)."""
    rbac = client.RbacAuthorizationV1Api(fresh_api)
    docs = chart.documents(chart.template(helm_bin, "--show-only=templates/rbac.yaml"))
    view = next(d for d in docs if d["metadata"]["name"] == "projector-grants-view")
    server_side_apply(fresh_api, view, dry_run=False)

    def aggregated() -> bool:
        rules = rbac.read_cluster_role("view").rules or []
        return any("projectiongrants" in (r.resources or []) for r in rules)

    eventually(aggregated, message="projector-grants-view aggregated into view")
    binding = client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name="alice-views"),
        role_ref=client.V1RoleRef(
            api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="view"
        ),
        subjects=[
            client.RbacV1Subject(kind="User", name="alice", api_group="rbac.authorization.k8s.io")
        ],
    )
    with contextlib.suppress(client.ApiException):
        rbac.create_cluster_role_binding(binding)
    authz = client.AuthorizationV1Api(fresh_api)

    def may(verb: str, resource: str, group: str = "projector.nebari.dev", sub: str = "") -> bool:
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user="alice",
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, group=group, resource=resource, subresource=sub or None
                ),
            )
        )
        return bool(authz.create_subject_access_review(review).status.allowed)

    eventually(lambda: may("list", "projectiongrants"), message="alice lists grants")
    assert may("get", "projectiongrants", sub="status") and may("watch", "projectiongrants")
    assert not may("create", "projectiongrants") and not may("delete", "projectiongrants")
    assert not may("update", "projectiongrants", sub="status")
    assert not may("get", "secrets", group="")
