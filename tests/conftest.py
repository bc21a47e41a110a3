"""Fixtures and hooks shared by every test.

The control plane is a session fixture, so it starts only if a collected test asks for it (all
integration tests do, through ``admin_client`` or ``namespace``); ``pytest tests/unit`` needs no
server. It runs in pytest's tmp dir, never in ``.local/``, so it cannot collide with a developer's
``make cluster-up``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path

import pytest
from kubernetes import client

from tests import reliability
from tests.bed.controlplane.plane import APISERVER, ControlPlane, ensure_binaries
from tests.bed.kube import (
    api_client,
    bind_service_account,
    eventually,
    token_kubeconfig,
    unique_name,
)
from tests.support import (
    Canaries,
    Cluster,
    NamespaceFactory,
    ServiceAccountKubeconfigFactory,
    docker_unavailable_reason,
    status_of,
)

TESTS_DIR = Path(__file__).resolve().parent
CATEGORIES = ("unit", "integration", "harness", "node", "kind")
PEAK_RSS = pytest.StashKey[dict[str, int]]()


# --- markers ------------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its directory (tests/unit -> unit, ...), so `-m` selects by cost."""
    for item in items:
        try:
            top = item.path.resolve().relative_to(TESTS_DIR).parts[0]
        except ValueError:
            continue
        if top in CATEGORIES:
            item.add_marker(getattr(pytest.mark, top))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip kind tests, saying why, where no Docker engine runs; and faults or scenarios held
    for minutes (marked `long`) unless PROJECTOR_LONG_FAULTS=1 (`make reliability-docs` and
    `make observability-docs` set it)."""
    if (
        item.get_closest_marker("long") is not None
        and os.environ.get("PROJECTOR_LONG_FAULTS") != "1"
    ):
        pytest.skip(
            "held for minutes: PROJECTOR_LONG_FAULTS=1 (make reliability-docs, observability-docs)"
        )
    if item.get_closest_marker("kind") is not None:
        reason = docker_unavailable_reason()
        if reason is not None:
            pytest.skip(reason)


def _category(report: pytest.TestReport) -> str:
    for category in reversed(CATEGORIES):  # a kind test may also be an integration test
        if category in report.keywords:
            return category
    return "other"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """Counts per category and every skip with its reason, so skipped work is never silent."""
    counts: dict[str, Counter[str]] = {c: Counter() for c in (*CATEGORIES, "other")}
    skips: list[tuple[str, str]] = []
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for report in terminalreporter.stats.get(outcome, []):
            if not isinstance(report, pytest.TestReport):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            counts[_category(report)]["failed" if outcome == "error" else outcome] += 1
            if outcome == "skipped":
                longrepr = report.longrepr
                reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
                skips.append((report.nodeid, reason.removeprefix("Skipped: ")))
    terminalreporter.write_sep("-", "projector test summary")
    for category, counter in counts.items():
        if category == "other" and not counter:
            continue
        line = (
            f"{category:<12} {counter['passed']:>4} passed {counter['failed']:>4} failed "
            f"{counter['skipped']:>4} skipped"
        )
        extra = [f"{counter[o]} {o}" for o in ("xfailed", "xpassed") if counter[o]]
        terminalreporter.write_line(", ".join([line, *extra]))
    for nodeid, reason in skips:
        terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}")
    peaks = config.stash.get(PEAK_RSS, None)
    if peaks:
        parts = [f"{name} {kib / 1024:.0f} MiB" for name, kib in peaks.items()]
        total = sum(peaks.values()) / 1024
        terminalreporter.write_line(
            f"control plane peak RSS (VmHWM): {', '.join(parts)}; total {total:.0f} MiB"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With PROJECTOR_UPDATE_DOCS=1, a green session's fault records become docs/reliability.md."""
    if os.environ.get("PROJECTOR_UPDATE_DOCS") == "1" and exitstatus == 0 and reliability.session:
        reliability.write_doc(sorted(reliability.session, key=lambda r: r.fault))


# --- no asyncio task outlives its test ----------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_task_left_running(request: pytest.FixtureRequest) -> None:
    """An async test fails if a task it started is still running once its fixtures are gone.

    pytest-asyncio closes each test's event loop by cancelling what is left, silently: a watch,
    worker or timer that the code under test started and never stopped would pass unseen. Only
    async tests have a loop, so only they ask for the check; it is set up first, so it is torn
    down last, after every fixture that stops what it started (kopf's
    `_no_asyncio_pending_tasks` is the model).
    """
    if request.node.get_closest_marker("asyncio") is not None:
        request.getfixturevalue("_asyncio_tasks_checked")


@pytest.fixture
async def _asyncio_tasks_checked() -> AsyncIterator[None]:
    """Fail, naming them, on tasks of the test's loop that are still running after it."""
    before = asyncio.all_tasks()
    yield
    for _ in range(3):  # a task cancelled by a teardown ends within a turn or two
        await asyncio.sleep(0)
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and t not in before and not t.done()]
    if left:
        named = "\n".join(f"  {_describe(t)}" for t in sorted(left, key=lambda t: t.get_name()))
        pytest.fail(f"{len(left)} asyncio task(s) left running after the test:\n{named}")


def _describe(task: asyncio.Task[object]) -> str:
    """The task's name, its coroutine and where it waits (file:line), for the failure."""
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", repr(coro))
    frame = getattr(coro, "cr_frame", None)
    where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
    return f"{task.get_name()}: {name}{where}"


# --- the control plane and clients --------------------------------------------------------------


@pytest.fixture(scope="session")
def binaries() -> Path:
    """The directory of etcd, kube-apiserver and kube-controller-manager (built once, cached)."""
    return ensure_binaries()


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"""
"""Every write, with who sent it (user, User-Agent) and when: the API side of fencing tests."""


@pytest.fixture(scope="session")
def audit_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's API server writes its audit log (JSON lines, writes only)."""
    return tmp_path_factory.mktemp("audit") / "audit.log"


@pytest.fixture(scope="session")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
    binaries: Path,
    audit_log: Path,
) -> Iterator[ControlPlane]:
    """A fresh etcd + kube-apiserver + kube-controller-manager for this session."""
    policy = audit_log.with_name("policy.yaml")
    policy.write_text(AUDIT_POLICY)
    audit = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}"]
    plane = ControlPlane(
        tmp_path_factory.mktemp("control-plane"),
        binaries,
        die_with_parent=True,
        extra_args={APISERVER: audit},
    )
    plane.start()
    try:
        yield plane
    finally:
        pytestconfig.stash[PEAK_RSS] = plane.peak_rss_kib()
        plane.stop()
        shutil.rmtree(plane.root / "etcd-data", ignore_errors=True)  # keep logs, drop the WAL


@pytest.fixture(scope="session")
def admin_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """The official client as system:masters: tests arrange and assert with a different client
    from the code under test, so a bug in our transport cannot hide itself."""
    api = api_client(control_plane.kubeconfig)
    yield api
    api.close()


@pytest.fixture(scope="session")
def core_v1(admin_client: client.ApiClient) -> client.CoreV1Api:
    """Admin CoreV1Api."""
    return client.CoreV1Api(admin_client)


@pytest.fixture(scope="session")
def custom_objects(admin_client: client.ApiClient) -> client.CustomObjectsApi:
    """Admin CustomObjectsApi (ProjectionGrants and test CRDs)."""
    return client.CustomObjectsApi(admin_client)


@pytest.fixture(scope="session")
def rbac_v1(admin_client: client.ApiClient) -> client.RbacAuthorizationV1Api:
    """Admin RbacAuthorizationV1Api."""
    return client.RbacAuthorizationV1Api(admin_client)


# --- per-test objects ---------------------------------------------------------------------------


def _delete_ignoring_404(delete: Callable[[], object]) -> None:
    try:
        delete()
    except client.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def make_namespace(
    core_v1: client.CoreV1Api, request: pytest.FixtureRequest
) -> Iterator[NamespaceFactory]:
    """Create namespaces named after the test; delete them afterwards and wait until they are
    gone, so no copy, Secret or namespace event of this test reaches the next one."""
    created: list[str] = []

    def make(name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
        name = name or unique_name(request.node.name)
        meta = client.V1ObjectMeta(name=name, labels=dict(labels) if labels else None)
        core_v1.create_namespace(client.V1Namespace(metadata=meta))
        created.append(name)
        return name

    yield make
    for name in created:
        _delete_ignoring_404(functools.partial(core_v1.delete_namespace, name))

    def gone() -> bool:
        read = core_v1.read_namespace
        left = [n for n in created if status_of(functools.partial(read, n)) != 404]
        assert not left, left
        return True

    eventually(gone, timeout=180, interval=0.2, message="test namespaces never went away")


@pytest.fixture
def canaries() -> Canaries:
    """Secret values this test planted."""
    return Canaries()


@pytest.fixture
def k8s(
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    canaries: Canaries,
    request: pytest.FixtureRequest,
    make_namespace: NamespaceFactory,
) -> Iterator[Cluster]:
    """The test's view of the cluster; its grants are scanned for canaries and deleted after.

    It depends on `make_namespace` so that the scan reads the statuses the test ended with,
    before its namespaces go away and a controller rewrites them.
    """
    c = Cluster(core_v1, custom_objects, canaries, request.node.name)
    yield c
    try:
        c.scan()
    finally:
        c.cleanup()


@pytest.fixture
def namespace(make_namespace: NamespaceFactory) -> str:
    """A unique namespace for this test."""
    return make_namespace()


@pytest.fixture
def service_account_kubeconfig(
    core_v1: client.CoreV1Api,
    rbac_v1: client.RbacAuthorizationV1Api,
    admin_client: client.ApiClient,
    tmp_path: Path,
) -> Iterator[ServiceAccountKubeconfigFactory]:
    """Kubeconfigs for ServiceAccounts bound to a named ClusterRole, via TokenRequest.

    The controller under test runs with exactly the shipped RBAC: a missing permission fails the
    test instead of hiding behind admin credentials.
    """
    bindings: list[str] = []
    auth_v1 = client.AuthorizationV1Api(admin_client)

    def make(cluster_role: str, namespace: str) -> Path:
        name = unique_name(cluster_role)
        core_v1.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
        )
        binding = unique_name(f"tests-{namespace}-{name}")
        bind_service_account(rbac_v1, binding, cluster_role, name, namespace)
        bindings.append(binding)
        user = f"system:serviceaccount:{namespace}:{name}"
        _wait_until_bound(rbac_v1, auth_v1, cluster_role, user, namespace)
        return token_kubeconfig(
            tmp_path / f"{name}.kubeconfig", core_v1.api_client, name, namespace
        )

    yield make
    for binding in bindings:
        _delete_ignoring_404(functools.partial(rbac_v1.delete_cluster_role_binding, binding))


def _wait_until_bound(
    rbac_v1: client.RbacAuthorizationV1Api,
    auth_v1: client.AuthorizationV1Api,
    cluster_role: str,
    user: str,
    namespace: str,
) -> None:
    """Wait until the RBAC authorizer's cache has the new binding (checked on the role's first
    rule), so the first request of the code under test is not a spurious 403."""
    try:
        rules = rbac_v1.read_cluster_role(cluster_role).rules or []
    except client.ApiException as exc:
        if exc.status == 404:
            return  # the role may be created later by the test; nothing to wait for yet
        raise
    rule = next((r for r in rules if r.resources and r.verbs and not r.resource_names), None)
    if rule is None:
        return
    attributes = client.V1ResourceAttributes(
        group=(rule.api_groups or [""])[0].replace("*", ""),
        resource=rule.resources[0] if rule.resources else "",
        verb=rule.verbs[0],
        namespace=namespace,
    )
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            resource_attributes=attributes,
        )
    )

    def allowed() -> bool:
        status = auth_v1.create_subject_access_review(review).status
        return bool(status and status.allowed)

    eventually(allowed, timeout=10.0, message=f"RBAC never allowed {user} via {cluster_role}")
