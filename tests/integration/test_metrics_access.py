"""/metrics as the chart ships it, on the real API server: HTTPS on a port of its own, served only
to a bearer token that a TokenReview authenticates and a SubjectAccessReview allows to `get`
/metrics; the probes stay plain HTTP. The controller runs with the shipped RBAC (it may create
both reviews) and the scraper is bound to the shipped metrics-reader ClusterRole."""

from __future__ import annotations

import http.client
import secrets
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests.bed.kube import eventually, request_token
from tests.bed.launcher import ControllerProcess, launch, unverified_tls
from tests.support import Canaries, metrics_allowed


def scrape(url: str, token: str | None, tls: ssl.SSLContext | None = None) -> tuple[int, str]:
    """GET `url` with `token` as a bearer token: (status, body)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5, context=tls) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


@pytest.fixture
def stranger_token(
    core_v1: client.CoreV1Api, admin_client: client.ApiClient, namespace: str
) -> str:
    """A valid token of a ServiceAccount that nothing lets read /metrics."""
    sa = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="stranger"))
    core_v1.create_namespaced_service_account(namespace, sa)
    assert not metrics_allowed(admin_client, namespace, "stranger")
    return request_token(core_v1, "stranger", namespace, expiration_seconds=600)


def test_metrics_are_https_for_allowed_tokens_only_and_the_probes_plain_http(
    controller: ControllerProcess, stranger_token: str, canaries: Canaries
) -> None:
    ctl, tls = controller, unverified_tls()
    garbage = "CANARY-token-" + secrets.token_urlsafe(32)
    for token in (garbage, stranger_token, str(ctl.metrics_token)):
        canaries.add(token)  # none of them may be logged, nor appear on the page
    assert ctl.metrics_url.startswith("https://")
    # The kubelet's probes: plain HTTP, no token.
    assert ctl.get("/healthz") == (200, "ok\n") and ctl.get("/readyz") == (200, "ok\n")
    assert scrape(f"http://127.0.0.1:{ctl.port}/metrics", None)[0] == 404  # not on the probes' port
    status, body = scrape(ctl.metrics_url, None, tls)
    assert status == 401 and "projector_" not in body
    assert scrape(ctl.metrics_url, garbage, tls)[0] == 401
    status, body = scrape(ctl.metrics_url, stranger_token, tls)
    assert status == 403 and "projector_" not in body
    status, page = scrape(ctl.metrics_url, ctl.metrics_token, tls)
    assert status == 200
    names = {f.name for f in text_string_to_metric_families(page)}
    assert {"projector_queue_depth", "projector_api_requests"} <= names
    # Plain HTTP is not served on the metrics port at all.
    with pytest.raises((OSError, http.client.HTTPException)):
        scrape(f"http://127.0.0.1:{ctl.metrics_port}/metrics", ctl.metrics_token)
    # The reviews went over the controller's own client: counted like its other requests.
    assert ctl.metric("projector_api_requests_total", resource="tokenreviews") >= 3
    assert ctl.metric("projector_api_requests_total", resource="subjectaccessreviews") >= 2


def test_verdicts_are_remembered_so_a_scraper_costs_two_reviews_a_minute(
    controller: ControllerProcess, stranger_token: str
) -> None:
    ctl, tls = controller, unverified_tls()

    def reviews() -> float:
        return ctl.metric("projector_api_requests_total", resource="tokenreviews")

    assert scrape(ctl.metrics_url, stranger_token, tls)[0] == 403
    before = reviews()
    for _ in range(5):
        assert scrape(ctl.metrics_url, stranger_token, tls)[0] == 403
        assert scrape(ctl.metrics_url, ctl.metrics_token, tls)[0] == 200
    assert reviews() == before


def test_no_metrics_secure_serves_plain_http_to_anyone(
    projector_kubeconfig: Path, tmp_path: Path, canaries: Canaries
) -> None:
    """The chart's metrics.secure=false: no TLS, no token, no review."""
    cp = launch(projector_kubeconfig, tmp_path / "plain.log")
    try:
        eventually(cp.ready, timeout=30, message="controller /readyz")
        assert cp.metrics_url.startswith("http://")
        status, page = scrape(cp.metrics_url, None)
        assert status == 200 and "projector_queue_depth" in page
        assert cp.metric("projector_api_requests_total", resource="tokenreviews") == 0
    finally:
        assert cp.stop() == 0
    canaries.assert_absent("controller logs", cp.logs())


def test_a_metrics_cert_dir_is_served(
    start_controller: Any, tmp_path: Path, canaries: Canaries
) -> None:
    """--metrics-cert-dir (the chart's metrics.certSecret): its certificate is the one served,
    and a client that verifies it against that certificate connects."""
    from projector.telemetry import certs

    pem = certs.self_signed(["localhost", "127.0.0.1"])
    key, marker, crt = pem.partition(b"-----END PRIVATE KEY-----\n")
    (tmp_path / "tls.key").write_bytes(key + marker)
    (tmp_path / "tls.crt").write_bytes(crt)
    ctl: ControllerProcess = start_controller(f"--metrics-cert-dir={tmp_path}")
    verify = ssl.create_default_context(cadata=crt.decode())
    status, page = scrape(ctl.metrics_url, ctl.metrics_token, verify)
    assert status == 200 and "projector_queue_depth" in page
