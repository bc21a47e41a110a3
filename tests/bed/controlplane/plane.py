"""A real etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback.

Integration tests, the demo and benchmarks need a real API server (DESIGN.md section 5); this
module starts one from the binaries that ``build.sh`` caches, with Node,RBAC authorization,
NodeRestriction, a ServiceAccount signing key so TokenRequest works, a node identity and a
kubelet client certificate so that a node (tests/bed/node) can join it, and records what it started
in its root directory so that a different process (``python -m tests.bed.controlplane down``) can
stop it.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import datetime as dt
import fcntl
import functools
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS_FILE = HERE / "versions.env"
DEFAULT_CRD_DIR = REPO_ROOT / "deploy" / "crds"

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
PROCESS_NAMES = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)
# Only what tests need: namespaces that finish deleting, ownerReference garbage collection,
# ResourceQuota usage (without it a quota's status stays empty and admission enforces nothing),
# and what a node's pods need: ServiceAccounts and their tokens, the kube-root-ca.crt ConfigMap
# in-cluster clients mount, Deployments -> ReplicaSets -> Pods, the node lifecycle (it removes the
# not-ready taint) and PodDisruptionBudget status; and the aggregation of labelled ClusterRoles
# into admin, edit and view (the chart's export and read-only roles).
KCM_CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "resourcequota-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
    "node-lifecycle-controller",
    "disruption-controller",
    "clusterrole-aggregation-controller",
)
NODE_KUBECONFIG = "node.kubeconfig"
# The API server's client identity towards kubelets (pods/log, exec): bound to this ClusterRole.
KUBELET_CLIENT = "kube-apiserver-kubelet-client"

STATE_FILE = "state.json"
ADMIN_KUBECONFIG = "admin.kubeconfig"
POLL_INTERVAL = 0.1
STOP_POLL_INTERVAL = 0.02
LOG_TAIL_LINES = 40
FAILURE_TAIL_LINES = 20  # per log and attempt, in start()'s error


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse the single-line ``KEY=value`` pins of a versions.env (control plane, or peers).

    A line with one quote opens or closes a multi-line value (a shell build script's): skipped.
    """
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line and line.count('"') != 1:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip().strip("'\"")
    return versions


def kube_version() -> str:
    """The Kubernetes version the plane runs: the pin, or make compat's PROJECTOR_KUBE_VERSION
    (build.sh reads the same variable)."""
    return os.environ.get("PROJECTOR_KUBE_VERSION") or read_versions()["KUBE_VERSION"]


def cache_dir() -> Path:
    """Mirror build.sh's cache location so the build lock lives next to the binaries."""
    if env := os.environ.get("PROJECTOR_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "projector"


def node_name() -> str:
    """The one node's name: the machine's hostname where it resolves to 127.0.0.1 (the API
    server reaches a kubelet by its Hostname address, and only loopback is a target here),
    else ``localhost``."""
    host = socket.gethostname().lower()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return "localhost"
    return host if addresses and all(a.startswith("127.") for a in addresses) else "localhost"


def ensure_binaries(script: Path = BUILD_SCRIPT) -> Path:
    """Run build.sh (a no-op when cached) under a lock and return the binaries directory.

    The lock keeps a ``make cluster-up`` and a pytest session from building into the same
    ``.tmp`` files at once. build.sh's progress goes to our stderr; its last stdout line is the dir.
    """
    lock_path = cache_dir() / "build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(
            ["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False
        )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ControlPlaneError(f"{script} failed with exit code {result.returncode}")
    binaries = Path(lines[-1])
    missing = [name for name in PROCESS_NAMES if not os.access(binaries / name, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{script} reported {binaries} but {missing} are missing there")
    return binaries


# --- certificates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


class TinyCA:
    """A throwaway ECDSA P-256 CA, like envtest's tinyca: one per trust domain, never persisted."""

    VALIDITY = dt.timedelta(days=365)

    def __init__(self, common_name: str) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "projector-tests"),
            ]
        )
        public_key = self._key.public_key()
        self.cert = (
            self._builder(self._name, public_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))  # tolerate clock skew
            .not_valid_after(now + self.VALIDITY)
        )

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, for trust bundles and --client-ca-file."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """Issue a leaf certificate; groups for Kubernetes client certs go in ``organizations``."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            self._builder(x509.Name(attributes), key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write(path: Path, data: bytes, *, secret: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if secret:
        path.chmod(0o600)
    return path


def kubeconfig_dict(
    server: str,
    ca_pem: bytes,
    *,
    user: str,
    cert: KeyPair | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A one-cluster, one-user kubeconfig with everything inline, so it can be copied anywhere."""
    credentials: dict[str, str] = {}
    if cert is not None:
        credentials["client-certificate-data"] = base64.b64encode(cert.cert_pem).decode()
        credentials["client-key-data"] = base64.b64encode(cert.key_pem).decode()
    if token is not None:
        credentials["token"] = token
    context: dict[str, str] = {"cluster": "projector-local", "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "projector-local",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }


def write_kubeconfig(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a kubeconfig readable only by us (it carries credentials)."""
    return _write(path, yaml.safe_dump(dict(config), sort_keys=False).encode(), secret=True)


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    """Ask the kernel for an unused loopback port (a small race remains; start() retries)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct unused loopback ports: every socket stays bound until all are picked."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Any:
    """libc's prctl, looked up in the parent: a dlopen() in a child forked from a threaded
    process can deadlock on a loader lock another thread held at fork time."""
    return ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent_hook() -> Callable[[], None]:
    """A preexec_fn asking Linux to SIGTERM the child when its parent dies, so no server
    outlives pytest.

    Linux sends the signal when the *thread* that forked the child exits, not the process: start
    a plane with die_with_parent from a thread that outlives the plane (the main thread, or a
    pool's worker that is still alive when stop() runs).
    """
    prctl = _prctl()
    parent = os.getpid()

    def hook() -> None:  # pragma: no cover - runs in the forked child
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl: nobody would stop us
            os._exit(1)

    return hook


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that identify a process and say whether it runs."""

    state: str
    ppid: int
    pgrp: int
    start_ticks: int  # clock ticks after boot: with the pid, an identity that survives pid reuse


def proc_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat (None if there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the comm before it may hold spaces and parens
    return ProcStat(
        state=fields[0], ppid=int(fields[1]), pgrp=int(fields[2]), start_ticks=int(fields[19])
    )


def _is_recorded_process(pid: int, exe: str, start_ticks: int | None) -> bool:
    """True if pid runs and is the process recorded in a state file (not a recycled pid).

    Only for processes another Python process started: a child of ours is asked of waitid().
    """
    stat = proc_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    if start_ticks is not None:
        return stat.start_ticks == start_ticks
    try:  # a state file from before start times were recorded: compare the executable
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)") == exe
    except OSError:
        return False


def _pids() -> Iterator[int]:
    return (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def process_groups() -> dict[int, list[int]]:
    """Pids of every live (not zombie) process, by process group id: one scan of /proc."""
    groups: dict[int, list[int]] = {}
    for pid in _pids():
        stat = proc_stat(pid)
        if stat is not None and stat.state not in ("Z", "X"):
            groups.setdefault(stat.pgrp, []).append(pid)
    return groups


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``."""
    return process_groups().get(pgid, [])


def processes_under(root: Path) -> list[tuple[int, str]]:
    """(pid, cmdline) of every process whose command line names a path inside root.

    Every server of a plane does (--data-dir, --cert-dir, --kubeconfig): this finds leaks that
    no pid records, e.g. after a state file was lost.
    """
    marker = f"{root.resolve()}/".encode()
    found = []
    for pid in _pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        stat = proc_stat(pid)
        if marker in cmdline and stat is not None and stat.state not in ("Z", "X"):
            found.append((pid, cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def peak_rss_kib(pid: int) -> int | None:
    """VmHWM from /proc, the peak resident set size of a process, in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The end of a log file, for error messages that explain themselves."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Process:
    """One started binary: its pid (also its process group: it leads its own session), the exe,
    its start time (the pid's identity for another process reading the state file), its log."""

    name: str
    exe: str
    pid: int
    log: Path
    start_ticks: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        """True while the process runs.

        A child of ours is asked of the kernel with waitid(WNOWAIT): authoritative at any moment,
        and it leaves an exited child unreaped, so its pid and process group id cannot be reused
        before reap() (signal() relies on that). Never /proc/<pid>/cmdline: between the exec()
        that Popen waits for and the kernel filling in the new argv, it reads empty (issue 14).
        A process recorded by another Python process is matched by pid and start time in /proc.
        """
        if self.popen is None:
            return _is_recorded_process(self.pid, self.exe, self.start_ticks)
        if self.popen.returncode is not None:
            return False
        try:
            exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind Popen's back: it is gone
            return self.popen.poll() is None
        return exited is None

    def exit_reason(self) -> str:
        """How a child of ours ended ("exit code 1", "killed by SIGKILL"), without reaping it."""
        if self.popen is None:
            return "exited"
        if self.popen.returncode is not None:
            code = self.popen.returncode
            return f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "exited"
        if info is None:
            return "running"
        if info.si_code == os.CLD_EXITED:
            return f"exit code {info.si_status}"
        return f"killed by {signal.Signals(info.si_status).name}"

    def signal(self, sig: signal.Signals) -> None:
        """Signal the whole process group, as long as its id is still ours.

        A child of ours: until reap() it is ours even when exited (a zombie leader keeps the
        group id reserved), so stragglers of its group are reached too. A recorded process: only
        while pid and start time still match.
        """
        if not self.owns_group():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def exited(self) -> bool:
        """Not alive()."""
        return not self.alive()

    def owns_group(self) -> bool:
        """True while the process group id ``pid`` is this process's (see signal())."""
        return self.popen.returncode is None if self.popen is not None else self.alive()

    def reap(self, timeout: float = 5.0) -> None:
        """Collect a child's status once it exits (only then is its pid free for reuse).

        Called after SIGKILL: a killed process may still be on its way out (not yet a zombie),
        so wait for it, boundedly, rather than leave its status uncollected.
        """
        if self.popen is not None and self.popen.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)


def stop_processes(
    processes: Sequence[Process], timeout: float = 15.0, kill_timeout: float = 5.0
) -> None:
    """SIGTERM each process group in the given order, waiting up to ``timeout`` for each; then
    SIGKILL every group (also one whose leader exited: stragglers die with it), wait until no
    member is left, and reap.

    Raises ControlPlaneError only if something survives SIGKILL for ``kill_timeout`` seconds.
    """
    for proc in processes:
        if proc.alive():
            proc.signal(signal.SIGTERM)
            _wait_until(proc.exited, time.monotonic() + timeout)
    ours = [proc for proc in processes if proc.owns_group()]
    for proc in ours:
        proc.signal(signal.SIGKILL)

    def left() -> list[str]:
        groups = process_groups()
        return [f"{p.name} group {p.pid}: pid {pid}" for p in ours for pid in groups.get(p.pid, [])]

    # Wait before reap(): until then no unrelated process can be given a group id of ours.
    _wait_until(lambda: not left(), time.monotonic() + kill_timeout)
    survivors = left()
    for proc in processes:
        proc.reap()
    if survivors:
        raise ControlPlaneError(f"still running after SIGKILL: {', '.join(survivors)}")


def _wait_until(done: Callable[[], bool], deadline: float) -> None:
    interval = 0.001  # most processes exit within milliseconds of a signal: poll fast at first
    while not done() and time.monotonic() < deadline:
        time.sleep(interval)
        interval = min(interval * 2, STOP_POLL_INTERVAL)


# --- the control plane --------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on free loopback ports under ``root``.

    Everything it writes lives in ``root``: ``pki/``, ``etcd-data/``, ``logs/<process>.log``,
    ``admin.kubeconfig`` and ``state.json`` (pids, exe paths and URLs for a separate process).
    """

    def __init__(
        self,
        root: Path,
        binaries: Path,
        *,
        crd_dir: Path | None = DEFAULT_CRD_DIR,
        start_timeout: float = 120.0,
        die_with_parent: bool = False,
        extra_args: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.root = root.resolve()
        self.binaries = binaries
        self.crd_dir = crd_dir
        self.start_timeout = start_timeout
        self.die_with_parent = die_with_parent
        self.extra_args = {name: list(args) for name, args in (extra_args or {}).items()}
        self.processes: dict[str, Process] = {}
        self._args: dict[str, list[str]] = {}  # each server's flags, for restart_apiserver()
        self.failed_attempts: list[str] = []  # of the last start(), each with its logs' tails
        self.server = ""
        self.etcd_url = ""
        self.kcm_url = ""
        self.scheduler_url = ""

    # paths
    @property
    def pki(self) -> Path:
        """Certificates and keys."""
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        """One log file per process."""
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig, credentials inline."""
        return self.root / ADMIN_KUBECONFIG

    @property
    def node_kubeconfig(self) -> Path:
        """The node's kubeconfig: ``system:node:<node_name()>`` in ``system:nodes``."""
        return self.root / NODE_KUBECONFIG

    @property
    def ca_file(self) -> Path:
        """The CA that signed the serving certificates."""
        return self.pki / "serving-ca.crt"

    # lifecycle
    def start(self, attempts: int = 3) -> None:
        """Start all three processes and return once the API is ready and CRDs are Established.

        Any failure stops everything this attempt started and retries from scratch (fresh
        ports, PKI and data dir), up to ``attempts`` times; the final ControlPlaneError carries
        every attempt's reason and the last lines of every log. An interrupt stops and re-raises.
        """
        failures = self.failed_attempts = []
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
                return
            except Exception as exc:
                failures.append(self._failure_report(attempt, exc))
                stop_error = self._stop_quietly()
                if stop_error is None and attempt < attempts:
                    first_line = failures[-1].splitlines()[0]
                    print(f"control plane: retrying after {first_line}", file=sys.stderr)
                    continue
                error = ControlPlaneError(
                    f"control plane under {self.root} did not start "
                    f"({len(failures)} of {attempts} attempts failed):\n\n" + "\n\n".join(failures)
                )
                if stop_error is not None:  # what survived holds ports and the data dir
                    error.add_note(f"stopping after the failed start also failed: {stop_error!r}")
                raise error from exc
            except BaseException as exc:
                if (stop_error := self._stop_quietly()) is not None:
                    exc.add_note(f"stopping after the interrupted start failed: {stop_error!r}")
                raise

    def _failure_report(self, attempt: int, exc: Exception) -> str:
        reason = str(exc) if isinstance(exc, ControlPlaneError) else repr(exc)
        lines = [f"attempt {attempt}: {reason}"]
        for name in PROCESS_NAMES:
            log = self.logs / f"{name}.log"
            if log.exists():
                text = tail(log, FAILURE_TAIL_LINES) or "(empty)"
                lines.append(f"--- last lines of {log}:\n{text}")
        return "\n".join(lines)

    def _stop_quietly(self) -> Exception | None:
        """stop() after a failed start, returning its error instead of raising it over the
        start's (a stop that raises during an except block would replace the real reason)."""
        try:
            self.stop()
        except Exception as exc:
            return exc
        return None

    def _start_once(self) -> None:
        self._clean()
        etcd_port, peer_port, api_port, kcm_port, scheduler_port = free_ports(5)
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        self.server = f"https://127.0.0.1:{api_port}"
        self.kcm_url = f"https://127.0.0.1:{kcm_port}"
        self.scheduler_url = f"https://127.0.0.1:{scheduler_port}"
        self._write_pki()

        peer = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            ETCD,
            [
                "--name=projector",
                f"--data-dir={self.root / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=projector={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_for(ETCD, f"{self.etcd_url}/health", tls=False)
        pki = self.pki
        self._spawn(
            APISERVER,
            [
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Endpoints may not point at loopback, so do not publish the `kubernetes` Service's.
                "--endpoint-reconciler-type=none",
                f"--secure-port={api_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'client-ca.crt'}",
                # Node: a kubelet reads only what its own pods use; NodeRestriction: it writes
                # only its own Node and its pods' status.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                # pods/log and exec: the API server calls the kubelet by its Hostname address
                # (a name that resolves to loopback) and checks its serving certificate.
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'serving-ca.crt'}",
                "--kubelet-preferred-address-types=Hostname",
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        self._write_state()
        self._wait_for(APISERVER, f"{self.server}/readyz", tls=True)
        self._spawn(
            CONTROLLER_MANAGER,
            [
                f"--kubeconfig={self.kubeconfig}",
                # No --authentication/authorization-kubeconfig: nobody calls its API but our
                # /healthz probe, an always-allowed path; with them it loops on a missing
                # requestheader CA.
                f"--controllers={','.join(KCM_CONTROLLERS)}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'serving-ca.crt'}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'kcm.crt'}",
                f"--tls-private-key-file={pki / 'kcm.key'}",
                "--profiling=false",
            ],
        )
        self._write_state()
        self._wait_for(CONTROLLER_MANAGER, f"{self.kcm_url}/healthz", tls=True)
        self._spawn(
            SCHEDULER,
            [
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={scheduler_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'scheduler.crt'}",
                f"--tls-private-key-file={pki / 'scheduler.key'}",
                "--profiling=false",
            ],
        )
        self._write_state()
        self._wait_for(SCHEDULER, f"{self.scheduler_url}/healthz", tls=True)
        self._bind_kubelet_client()
        if self.crd_dir is not None and self.crd_dir.is_dir():
            self.apply_crds(sorted(self.crd_dir.glob("*.y*ml")))

    def _bind_kubelet_client(self) -> None:
        """Let the API server's kubelet client identity call every kubelet API (logs, exec)."""
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": KUBELET_CLIENT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:kubelet-api-admin",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT}
            ],
        }
        base = f"{self.server}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
        self._request(
            "PATCH",
            f"{base}/{KUBELET_CLIENT}?fieldManager=projector-tests&force=true",
            body=json.dumps(binding).encode(),
            content_type="application/apply-patch+yaml",
        )

    def stop(self) -> None:
        """Stop scheduler, controller-manager, apiserver, etcd (in that order); nothing is left
        running.

        Each process group gets SIGTERM and a bounded wait, then every group gets SIGKILL and is
        reaped. Raises ControlPlaneError only if a process survives SIGKILL; it stays recorded
        in state.json so that a later ``down`` can try again.
        """
        order = [self.processes[n] for n in reversed(PROCESS_NAMES) if n in self.processes]
        try:
            stop_processes(order)
        finally:
            self.processes = {n: p for n, p in self.processes.items() if p.alive()}
            with contextlib.suppress(OSError):  # root may be gone already: nothing to record
                self._write_state()

    @contextlib.contextmanager
    def apiserver_down(self) -> Iterator[None]:
        """Stop kube-apiserver (etcd keeps the data) for the body, then start it again on the
        same port with the same flags and wait for /readyz: an outage, for fault tests."""
        stop_processes([self.processes[APISERVER]])
        try:
            yield
        finally:
            self._spawn(APISERVER, self._args[APISERVER])
            self._write_state()
            self._wait_for(APISERVER, f"{self.server}/readyz", tls=True)

    def running(self) -> bool:
        """True if every recorded process is alive and the API server answers /readyz."""
        return (
            len(self.processes) == len(PROCESS_NAMES)
            and all(p.alive() for p in self.processes.values())
            and self._probe(f"{self.server}/readyz", tls=True)[0]
        )

    def apply_crds(self, paths: Sequence[Path], timeout: float = 60.0) -> None:
        """Server-side apply each CRD and wait until it is Established (served, storable).

        Plain HTTPS instead of the kubernetes client: its import alone costs seconds per `up`.
        """
        base = f"{self.server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for doc in crd_documents(paths):
            name = doc["metadata"]["name"]
            self._request(
                "PATCH",
                f"{base}/{name}?fieldManager=projector-tests&force=true",
                body=json.dumps(doc).encode(),
                content_type="application/apply-patch+yaml",
            )
            names.append(name)
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = json.loads(self._request("GET", f"{base}/{name}"))
                conditions = (crd.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"CRD {name} not Established: {conditions}")
                time.sleep(POLL_INTERVAL)

    def version(self) -> dict[str, str]:
        """The server's /version document (gitVersion is `kube_version()`)."""
        return cast(dict[str, str], json.loads(self._get(f"{self.server}/version", tls=True)))

    def peak_rss_kib(self) -> dict[str, int]:
        """Peak RSS per live process (read before stopping: /proc forgets the dead)."""
        peaks = {name: peak_rss_kib(p.pid) for name, p in self.processes.items() if p.alive()}
        return {name: kib for name, kib in peaks.items() if kib is not None}

    # persistence, so `down` works from another process
    @classmethod
    def load(cls, root: Path) -> ControlPlane | None:
        """Rebuild a handle from ``root/state.json`` written by an earlier start()."""
        try:
            state = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        plane = cls(root, Path(state["binaries"]), crd_dir=None)
        plane.server = state.get("server", "")
        plane.etcd_url = state.get("etcd", "")
        plane.kcm_url = state.get("controller_manager", "")
        plane.scheduler_url = state.get("scheduler", "")
        for name, info in state.get("processes", {}).items():
            plane.processes[name] = Process(
                name,
                info["exe"],
                int(info["pid"]),
                Path(info["log"]),
                start_ticks=info.get("start_ticks"),
            )
        return plane

    def _write_state(self) -> None:
        state = {
            "binaries": str(self.binaries),
            "server": self.server,
            "etcd": self.etcd_url,
            "controller_manager": self.kcm_url,
            "scheduler": self.scheduler_url,
            "kubeconfig": str(self.kubeconfig),
            "processes": {
                name: {"pid": p.pid, "exe": p.exe, "log": str(p.log), "start_ticks": p.start_ticks}
                for name, p in self.processes.items()
            },
        }
        tmp = self.root / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.root / STATE_FILE)

    # internals
    def _clean(self) -> None:
        """Start from scratch: remove only what start() creates (root may be a user's dir)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("pki", "etcd-data", "logs"):
            shutil.rmtree(self.root / name, ignore_errors=True)
            if (self.root / name).exists():
                raise ControlPlaneError(f"cannot remove {self.root / name} for a fresh start")
        for name in (ADMIN_KUBECONFIG, NODE_KUBECONFIG, STATE_FILE):
            (self.root / name).unlink(missing_ok=True)
        self.logs.mkdir()

    def _write_pki(self) -> None:
        serving_ca = TinyCA("projector-tests-serving-ca")
        client_ca = TinyCA("projector-tests-client-ca")
        apiserver, kcm, scheduler = (
            serving_ca.issue(cn, server=True, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
            for cn in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
        )
        admin = client_ca.issue("admin", organizations=["system:masters"], client=True)
        node = node_name()
        # The node's identity (the Node authorizer's system:node:NAME in system:nodes), the
        # kubelet's serving certificate (checked by the API server), and the API server's
        # client certificate towards the kubelet.
        node_client = client_ca.issue(
            f"system:node:{node}", organizations=["system:nodes"], client=True
        )
        kubelet_serving = serving_ca.issue(
            node, server=True, dns_names=sorted({node, "localhost"}), ip_addresses=["127.0.0.1"]
        )
        kubelet_client = client_ca.issue(KUBELET_CLIENT, client=True)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        sa_pub = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pki = self.pki
        _write(pki / "serving-ca.crt", serving_ca.cert_pem)
        _write(pki / "client-ca.crt", client_ca.cert_pem)
        pairs = (
            ("apiserver", apiserver),
            ("kcm", kcm),
            ("scheduler", scheduler),
            ("admin", admin),
            ("node", node_client),
            ("kubelet", kubelet_serving),
            ("kubelet-client", kubelet_client),
        )
        for name, pair in pairs:
            _write(pki / f"{name}.crt", pair.cert_pem)
            _write(pki / f"{name}.key", pair.key_pem, secret=True)
        _write(pki / "sa.key", _key_pem(sa_key), secret=True)
        _write(pki / "sa.pub", sa_pub)
        write_kubeconfig(
            self.kubeconfig,
            kubeconfig_dict(self.server, serving_ca.cert_pem, user="admin", cert=admin),
        )
        write_kubeconfig(
            self.node_kubeconfig,
            kubeconfig_dict(
                self.server, serving_ca.cert_pem, user=f"system:node:{node}", cert=node_client
            ),
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        """Start one server in its own session (so stop() can kill its whole process group)."""
        exe = str(self.binaries / name)
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            try:
                popen = subprocess.Popen(
                    [exe, *args, *self.extra_args.get(name, [])],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.root,
                    start_new_session=True,
                    preexec_fn=die_with_parent_hook() if self.die_with_parent else None,
                )
            except OSError as exc:
                raise ControlPlaneError(f"cannot start {name} ({exe}): {exc}") from exc
        stat = proc_stat(popen.pid)  # our unreaped child: its /proc entry exists even if it died
        start_ticks = None if stat is None else stat.start_ticks
        self.processes[name] = Process(name, exe, popen.pid, log, start_ticks, popen)
        self._args[name] = args

    def _wait_for(self, name: str, url: str, *, tls: bool) -> None:
        """Poll a health URL until it is healthy, failing fast if a process exits.

        Logs are not quoted here: start() reports the last lines of every log.
        """
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for proc in self.processes.values():
                if not proc.alive():
                    raise ControlPlaneError(
                        f"{proc.name} (pid {proc.pid}) ended ({proc.exit_reason()}) "
                        f"while waiting for {name} ({url})"
                    )
            healthy, last = self._probe(url, tls=tls)
            if healthy:
                return
            time.sleep(POLL_INTERVAL)
        raise ControlPlaneError(
            f"{name} not ready at {url} after {self.start_timeout:.0f}s (last: {last})"
        )

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return ctx

    def _probe(self, url: str, *, tls: bool) -> tuple[bool, str]:
        """GET a health endpoint: (healthy, body or error). etcd says JSON, Kubernetes says ok."""
        try:
            body = self._get(url, tls=tls)
        except ControlPlaneError as exc:
            return False, str(exc)
        return body.strip() == "ok" or '"health":"true"' in body, body[:500]

    def _get(self, url: str, *, tls: bool) -> str:
        """GET with the admin client certificate (system:masters is authorized before RBAC is)."""
        return self._request("GET", url, tls=tls).decode()

    def _request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
        tls: bool = True,
    ) -> bytes:
        request = urllib.request.Request(url, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", content_type)
        try:
            ctx = self._ssl_context() if tls else None
            with urllib.request.urlopen(request, timeout=10, context=ctx) as resp:
                return cast(bytes, resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ControlPlaneError(f"{method} {url}: HTTP {exc.code}: {detail}") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ControlPlaneError(f"{method} {url}: {exc!r}") from exc


def crd_documents(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    """Every YAML document in paths; anything but a CRD is a mistake in deploy/crds/."""
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc.get("kind") != "CustomResourceDefinition":
                raise ControlPlaneError(f"{path}: expected only CustomResourceDefinitions")
            yield cast(dict[str, Any], doc)


def describe(plane: ControlPlane) -> str:
    """A few lines for `status`: one per process, then the server URL."""
    lines = []
    for name in PROCESS_NAMES:
        proc = plane.processes.get(name)
        state = "not started" if proc is None else ("running" if proc.alive() else "dead")
        pid = "" if proc is None else f" pid {proc.pid}"
        lines.append(f"{name:<24}{state}{pid}")
    lines.append(f"server: {plane.server or '-'}")
    return "\n".join(lines)


__all__ = [
    "APISERVER",
    "CONTROLLER_MANAGER",
    "ETCD",
    "REPO_ROOT",
    "SCHEDULER",
    "ControlPlane",
    "ControlPlaneError",
    "KeyPair",
    "TinyCA",
    "describe",
    "ensure_binaries",
    "kubeconfig_dict",
    "node_name",
    "proc_stat",
    "processes_under",
    "read_versions",
    "write_kubeconfig",
]
