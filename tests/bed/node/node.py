"""A real node on this machine: containerd + kubelet + Debian's runc, joined to the local plane.

No Docker: the kubelet and containerd are built from their Go modules
(tests/bed/controlplane/build.sh, tests/bed/node/build.sh), runc and the CNI plugins are Debian's
(``make node-packages``), and the pause image is built here from the kubernetes module's
``pause.c``. Every setting below that differs
from a default was a blocking error on this machine: see docs/node.md.

What the kubelet, containerd and the CNI plugins change outside their configured roots is
recorded *before* anything starts (``host-state.json`` under the node's root: the sysctls' values
and which of the known paths existed), and ``stop()`` puts it back: no process, mount, cgroup,
network namespace or file outside the root is left, every sysctl has the value it had.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from tests.bed.controlplane.plane import (
    REPO_ROOT,
    ControlPlane,
    ControlPlaneError,
    Process,
    cache_dir,
    die_with_parent_hook,
    free_ports,
    node_name,
    proc_stat,
    processes_under,
    read_versions,
    stop_processes,
    tail,
)

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
VERSIONS = read_versions()
KUBE_VERSION = VERSIONS["KUBE_VERSION"]
PAUSE_IMAGE = f"localhost/pause:{KUBE_VERSION}"
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"
NODE_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "pause")
CONTAINERD, KUBELET, API_PROXY = "containerd", "kubelet", "api-proxy"
# Inside each pod's network namespace, the API server answers on 127.0.0.1:API_PROXY_PORT
# (tests/bed/node/apiproxy.py): pods set KUBERNETES_SERVICE_HOST/PORT to it.
API_PROXY_PORT = 443
STATE_FILE = "node.json"
HOST_STATE_FILE = "host-state.json"
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI's images and containers

# The kubelet tunes these at start (setupKernelTunables); the bridge plugin sets ip_forward.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
# Created by the kubelet, containerd, the shims or the CNI plugins whatever their roots are.
HOST_PATHS = (
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/kubelet",
    "/run/containerd",
    "/run/nri",
    "/opt/containerd",
    "/var/lib/cni",
    "/run/netns",
    "/etc/kubernetes",
)
# What a kubelet with makeIPTablesUtilChains (its default) leaves in iptables; removed on stop
# when they were not there before (the chains and the jumps to them).
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
IPTABLES = ("iptables", "ip6tables")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAMES = ("kubepods", "kubepods.slice", "k8s.io")
SYNC_FREQUENCY = "100ms"  # the kubelet's pod-worker resync: how soon a Secret volume follows
NODE_OWNER = "node-owner.json"


class NodeError(RuntimeError):
    """The node could not be built, started, reached or cleaned up."""


def ensure_node_binaries(script: Path = BUILD_SCRIPT) -> Path:
    """Run tests/bed/node/build.sh (a no-op when cached; it takes its own lock) -> its bin dir."""
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise NodeError(f"{script} failed with exit code {result.returncode}")
    binaries = Path(lines[-1])
    missing = [n for n in NODE_BINARIES if not os.access(binaries / n, os.X_OK)]
    if missing:
        raise NodeError(f"{script} reported {binaries} but {missing} are missing there")
    return binaries


def missing_prerequisites() -> str | None:
    """Why no node can run here (None if it can): root, and Debian's runc and CNI plugins."""
    if os.geteuid() != 0:
        return "a node needs root (kubelet, containerd, runc, cgroups, mounts)"
    missing = [p for p in (RUNC, f"{CNI_BIN_DIR}/loopback") if not os.access(p, os.X_OK)]
    if missing:
        return (
            f"{', '.join(missing)} missing: run `make node-packages` (Debian's runc, CNI plugins)"
        )
    foreign = foreign_kubelets()
    if foreign:
        return (
            f"a kubelet not started by this project runs here (pid {foreign[0]}): "
            "its pods and cgroups are not ours to touch"
        )
    return None


def foreign_kubelets() -> list[int]:
    """Pids of kubelets on this machine that are not this project's (not from its cache)."""
    ours = str(cache_dir())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        if Path(exe).name == "kubelet" and not exe.startswith(ours):
            found.append(int(entry.name))
    return found


# --- what the node changes on the host ----------------------------------------------------------


def read_sysctls() -> dict[str, str]:
    """The current value of every sysctl a node may change (absent ones are left out)."""
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = Path("/proc/sys", name).read_text().strip()
    return values


def mounts_under(prefixes: Sequence[str]) -> list[str]:
    """Mount points (deepest first) at or under any of the prefixes, from /proc/self/mountinfo."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def iptables_rules() -> list[str]:
    """Every iptables and ip6tables chain and rule, without counters or comments."""
    lines = []
    for tool in IPTABLES:
        if shutil.which(f"{tool}-save") is None:
            continue
        out = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line and not line.startswith("#"):
                lines.append(f"{tool} {line.split(' [')[0] if line.startswith(':') else line}")
    return lines


def remove_kubelet_chains(existed: Sequence[str]) -> list[str]:
    """Delete the kubelet's chains (and the rules jumping to them) that are not in ``existed``;
    the errors, if any."""
    errors = []
    for line in iptables_rules():
        tool, _, rule = line.partition(" ")
        if rule.startswith("-A ") and any(f"-j {c}" in rule for c in KUBELET_CHAINS):
            if line in existed:
                continue
            table = _table_of(tool, rule)
            args = [tool, "-w", "-t", table, "-D", *rule.split()[1:]]
            if subprocess.run(args, capture_output=True, check=False).returncode != 0:
                errors.append(" ".join(args))
    for line in iptables_rules():
        tool, _, rule = line.partition(" ")
        if rule.startswith(":") and rule[1:].split()[0] in KUBELET_CHAINS and line not in existed:
            chain, table = rule[1:].split()[0], _table_of(tool, rule)
            for op in ("-F", "-X"):
                cmd = [tool, "-w", "-t", table, op, chain]
                if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
                    errors.append(" ".join(cmd))
    # Tables that listing or a canary chain brought into nftables (iptables-nft): remove those
    # that did not exist before and hold no rule (an empty table with ACCEPT policies is inert).
    if shutil.which("nft") is not None:
        current = iptables_rules()
        for line in current:
            tool, _, rule = line.partition(" ")
            if not rule.startswith("*") or line in existed:
                continue
            table = rule[1:]
            rules = [
                r
                for r in current
                if r.startswith(f"{tool} -A ") and _table_of(tool, r.partition(" ")[2]) == table
            ]
            if not rules:
                family = "ip" if tool == "iptables" else "ip6"
                cmd = ["nft", "delete", "table", family, table]
                if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
                    errors.append(" ".join(cmd))
    return errors


def _table_of(tool: str, rule: str) -> str:
    """The table a line of ``tool-save`` belongs to (the last ``*table`` before it)."""
    out = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False).stdout
    table = "filter"
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif (line.split(" [")[0] if line.startswith(":") else line) == rule:
            return table
    return table


def node_cgroups() -> list[Path]:
    """Every cgroup directory the kubelet or containerd made, in every hierarchy, deepest first."""
    found: list[Path] = []
    hierarchies = [CGROUP_ROOT] + [p for p in CGROUP_ROOT.iterdir() if p.is_dir()]
    for hierarchy in hierarchies:
        for name in CGROUP_NAMES:
            top = hierarchy / name
            if top.is_dir():
                found.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(set(found), key=lambda p: (-len(p.parts), str(p)))


@dataclass(frozen=True)
class HostSnapshot:
    """What a node may leave behind: compare one taken before start with one after stop."""

    sysctls: dict[str, str]
    paths: dict[str, bool]
    mounts: list[str]
    cgroups: list[str]
    processes: list[str]
    links: list[str]
    iptables: list[str]

    @classmethod
    def take(cls, root: Path) -> HostSnapshot:
        """Read the host now; processes are those naming ``root`` or the node's shims."""
        prefixes = [str(root), *HOST_PATHS]
        return cls(
            sysctls=read_sysctls(),
            paths={p: os.path.lexists(p) for p in HOST_PATHS},
            mounts=mounts_under(prefixes),
            cgroups=[str(c) for c in node_cgroups()],
            processes=[cmd for _, cmd in processes_under(root)],
            links=sorted(p.name for p in Path("/sys/class/net").iterdir()),
            iptables=iptables_rules(),
        )


# --- configuration ------------------------------------------------------------------------------


def containerd_config(root: Path, binaries: Path) -> str:
    """containerd v2 (config version 3): everything under root, CRI on, NRI off, pause pinned."""
    cri_runtime = '[plugins."io.containerd.cri.v1.runtime"'
    return f"""\
version = 3
root = "{root / "containerd" / "root"}"
state = "{root / "containerd" / "state"}"
# The sandbox image is imported (images.py); the controller's is pulled from the test bed's
# registry (tests/bed/registry), which a hosts.toml under certs.d names as plain HTTP.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{root / "containerd.sock"}"

[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "containerd" / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{root / "certs.d"}"

{cri_runtime}]
  # Root here lacks CAP_SYS_RESOURCE: a sandbox asking for oom_score_adj -998 kills runc init
  # ("can't get final child's PID from pipe: EOF"). Never lower a score, only raise it.
  restrict_oom_score_adj = true
  enable_selinux = false
  {cri_runtime}.containerd]
    default_runtime_name = "runc"
    {cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      {cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  {cri_runtime}.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{root / "cni" / "net.d"}"
    max_conf_num = 1
"""


BRIDGE = "projector0"
POD_SUBNET = "10.244.0.0/24"


def pod_network(root: Path) -> dict[str, Any]:
    """The CNI conflist: a host-only bridge (no uplink, no masquerade, no iptables) and
    host-local IPAM with its state under root. containerd needs an address on each pod's eth0
    ("failed to find network info for sandbox" with loopback alone); the kubelet's probes reach
    pods on the bridge. The bridge plugin sets net.ipv4.ip_forward=1 (put back by stop())."""
    return {
        "cniVersion": "1.0.0",
        "name": "projector",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": str(root / "cni" / "ipam"),
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(
    root: Path, plane: ControlPlane, *, port: int, healthz_port: int
) -> dict[str, Any]:
    """The KubeletConfiguration: every value not at its default is one this machine needs."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 hierarchy and no systemd managing the kubelet; 1.35 refuses v1 unless told.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        # Only loopback: the API server calls it as https://NODE_NAME:port (resolves to 127.0.0.1).
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(plane.pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(plane.pki / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(plane.pki / "client-ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{root / 'containerd.sock'}",
        "imageServiceEndpoint": f"unix://{root / 'containerd.sock'}",
        "podLogsDir": str(root / "pod-logs"),
        # Kubernetes' default (1m) makes a rotated Secret reach a pod's file in 60-90 s.
        "syncFrequency": SYNC_FREQUENCY,
        "configMapAndSecretChangeDetectionStrategy": "Watch",
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        # Nothing to pull, so never garbage-collect the imported images.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "resolvConf": "/etc/resolv.conf",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "maxPods": 30,
        # Else the kubelet adds KUBE-FIREWALL (a DROP rule on INPUT and OUTPUT), KUBE-IPTABLES-HINT
        # and KUBE-KUBELET-CANARY chains to the host's iptables, which outlive it.
        "makeIPTablesUtilChains": False,
    }


# --- the node -----------------------------------------------------------------------------------


class Node:
    """containerd + kubelet under ``root``, registered with ``plane`` as :func:`node_name`.

    Only one node runs on a machine at a time (the kubelet's cgroups, /var/log/containers and
    the shims' /run/containerd are machine-wide): a lock in the binary cache says whose it is.
    """

    def __init__(
        self,
        root: Path,
        plane: ControlPlane,
        kube_binaries: Path,
        node_binaries: Path,
        *,
        die_with_parent: bool = False,
        start_timeout: float = 120.0,
    ) -> None:
        self.root = root.resolve()
        self.plane = plane
        self.kube_binaries = kube_binaries
        self.node_binaries = node_binaries
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self.name = node_name()
        self.processes: dict[str, Process] = {}

    @property
    def socket(self) -> Path:
        """containerd's CRI and API socket."""
        return self.root / "containerd.sock"

    @property
    def certs_dir(self) -> Path:
        """containerd's registry hosts directory (a ``HOST/hosts.toml`` per registry)."""
        return self.root / "certs.d"

    @property
    def logs(self) -> Path:
        """containerd.log and kubelet.log."""
        return self.root / "logs"

    # lifecycle
    def start(self) -> None:
        """Record the host, start containerd, import the pause image, start the kubelet, and
        return once the Node is Ready. Any failure stops everything and restores the host."""
        self._take_lock()
        try:
            self._start()
        except BaseException as exc:
            try:
                self.stop()
            except Exception as stop_exc:  # the start's reason stays the error
                exc.add_note(f"stopping after the failed start also failed: {stop_exc!r}")
            raise

    def _start(self) -> None:
        if (self.root / HOST_STATE_FILE).exists():  # a node that was never stopped: clean first
            self._cleanup_host()
        for name in ("containerd", "kubelet", "cni", "logs", "pod-logs", "images"):
            shutil.rmtree(self.root / name, ignore_errors=True)
        self.logs.mkdir(parents=True)
        snapshot = HostSnapshot.take(self.root)
        host_state = {
            "sysctls": snapshot.sysctls,
            "paths": snapshot.paths,
            "iptables": snapshot.iptables,
        }
        (self.root / HOST_STATE_FILE).write_text(json.dumps(host_state, indent=2) + "\n")

        (self.root / "containerd").mkdir()
        (self.root / "containerd.toml").write_text(containerd_config(self.root, self.node_binaries))
        net_d = self.root / "cni" / "net.d"
        net_d.mkdir(parents=True)
        (net_d / "10-projector.conflist").write_text(json.dumps(pod_network(self.root), indent=2))
        env = {"PATH": f"{self.node_binaries}:/usr/sbin:/usr/bin:/sbin:/bin"}
        self._spawn(
            CONTAINERD,
            self.node_binaries / "containerd",
            ["--config", str(self.root / "containerd.toml"), "--log-level", "warn"],
            env,
        )
        self._write_state()
        self._wait(CONTAINERD, lambda: self.ctr("version", check=False).returncode == 0)
        from tests.bed.node.images import (
            import_pause_image,  # images needs ctr, so after containerd
        )

        api_port = self.plane.server.rsplit(":", 1)[1]
        self._spawn(
            API_PROXY,
            Path(sys.executable),
            [
                "-m",
                "tests.bed.node.apiproxy",
                f"--root={self.root}",
                f"--target=127.0.0.1:{api_port}",
                f"--port={API_PROXY_PORT}",
            ],
            {"PYTHONPATH": str(REPO_ROOT)},
        )

        import_pause_image(self)

        port, healthz_port = free_ports(2)
        config = kubelet_config(self.root, self.plane, port=port, healthz_port=healthz_port)
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self._spawn(
            KUBELET,
            self.kube_binaries / "kubelet",
            [
                f"--config={self.root / 'kubelet.yaml'}",
                f"--kubeconfig={self.plane.node_kubeconfig}",
                f"--root-dir={self.root / 'kubelet'}",
                f"--hostname-override={self.name}",
                "--v=1",
            ],
            env,
        )
        self._write_state()
        self._wait("Node Ready", self.ready)

    def ready(self) -> bool:
        """True if the Node object says Ready=True (read as admin)."""
        try:
            node = json.loads(
                self.plane._request("GET", f"{self.plane.server}/api/v1/nodes/{self.name}")
            )
        except ControlPlaneError:
            return False
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def running(self) -> bool:
        """Both processes alive and the Node Ready."""
        return (
            set(self.processes) == {CONTAINERD, KUBELET, API_PROXY}
            and all(p.alive() for p in self.processes.values())
            and self.ready()
        )

    def stop(self) -> None:
        """Stop the kubelet, every pod, the shims and containerd; then put the host back."""
        try:
            if KUBELET in self.processes:
                stop_processes([self.processes[KUBELET]])
            self._kill_pods()
            if API_PROXY in self.processes:
                stop_processes([self.processes[API_PROXY]])
            shims = [pid for pid, cmd in processes_under(self.root) if "containerd-shim" in cmd]
            for pid in shims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if CONTAINERD in self.processes:
                stop_processes([self.processes[CONTAINERD]])
            left = processes_under(self.root)
            deadline = time.monotonic() + 10
            while left and time.monotonic() < deadline:
                for pid, _ in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)  # allowed-sleep: poll interval of a loop with a deadline
                left = processes_under(self.root)
            if left:
                raise NodeError(f"still running after SIGKILL: {left}")
            self.processes = {}
            self._cleanup_host()
        finally:
            with contextlib.suppress(OSError):
                self._write_state()
            self._release_lock()

    # internals
    def _kill_pods(self) -> None:
        """SIGKILL every process in the kubelet's and containerd's cgroups until none is left."""
        deadline = time.monotonic() + 15
        while True:
            pids: set[int] = set()
            for cgroup in node_cgroups():
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
            if not pids:
                return
            if time.monotonic() > deadline:
                raise NodeError(f"pod processes survive SIGKILL: {sorted(pids)}")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)  # allowed-sleep: poll interval of a loop with a deadline

    def _cleanup_host(self) -> None:
        """Unmount, remove cgroups and created paths, restore sysctls (from host-state.json)."""
        state_path = self.root / HOST_STATE_FILE
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError):  # unknown what was there: remove no path, set no sysctl
            state = {"sysctls": {}, "paths": dict.fromkeys(HOST_PATHS, True), "iptables": None}
        self._kill_pods()
        errors = []
        ours = [str(self.root), "/run/containerd", "/var/lib/kubelet"]
        # /run/netns may hold other tools' namespaces: only containerd's (cni-<uuid>) are ours.
        netns = [m for m in mounts_under(["/run/netns"]) if Path(m).name.startswith("cni-")]
        for point in [*mounts_under(ours), *netns]:
            result = subprocess.run(
                ["umount", "-l", point], capture_output=True, text=True, check=False
            )
            if result.returncode != 0 and point in mounts_under([point]):
                errors.append(f"umount {point}: {result.stderr.strip()}")
        if Path("/sys/class/net", BRIDGE).exists():
            result = subprocess.run(
                ["ip", "link", "delete", BRIDGE], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                errors.append(f"ip link delete {BRIDGE}: {result.stderr.strip()}")
        for cgroup in node_cgroups():
            try:
                cgroup.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                errors.append(f"rmdir {cgroup}: {exc}")
        if state.get("iptables") is not None:
            errors += remove_kubelet_chains(state["iptables"])
        existed: dict[str, bool] = state.get("paths", {})
        for path in HOST_PATHS:
            if not existed.get(path, False) and os.path.lexists(path):
                shutil.rmtree(path, ignore_errors=True)
                if os.path.lexists(path):
                    errors.append(f"cannot remove {path}")
        for name, value in cast(dict[str, str], state.get("sysctls", {})).items():
            target = Path("/proc/sys", name)
            try:
                if target.read_text().strip() != value:
                    target.write_text(value + "\n")
            except OSError as exc:
                errors.append(f"sysctl {name}={value}: {exc}")
        # Everything under root but the logs and configs, so a next start is clean.
        for name in ("containerd", "kubelet", "images"):
            shutil.rmtree(self.root / name, ignore_errors=True)
        if errors:
            raise NodeError("the host was not fully restored: " + "; ".join(errors))
        state_path.unlink(missing_ok=True)

    def ctr(
        self, *args: str, check: bool = True, input_path: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr -a SOCKET -n k8s.io ARGS`` (containerd's own client)."""
        command = [
            str(self.node_binaries / "ctr"),
            "-a",
            str(self.socket),
            "-n",
            K8S_NAMESPACE,
            *args,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
        if check and result.returncode != 0:
            raise NodeError(
                f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def _spawn(self, name: str, exe: Path, args: list[str], env: dict[str, str]) -> None:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [str(exe), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**os.environ, **env},
                start_new_session=True,
                preexec_fn=die_with_parent_hook() if self.die_with_parent else None,
            )
        stat = proc_stat(popen.pid)
        self.processes[name] = Process(
            name, str(exe), popen.pid, log, None if stat is None else stat.start_ticks, popen
        )

    def _wait(self, what: str, done: Any) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            for proc in self.processes.values():
                if not proc.alive():
                    raise NodeError(
                        f"{proc.name} ended ({proc.exit_reason()}) while waiting for {what}; "
                        f"last lines of {proc.log}:\n{tail(proc.log)}"
                    )
            if done():
                return
            time.sleep(0.1)  # allowed-sleep: poll interval of a loop with a deadline
        logs = "\n".join(f"--- {p.log}:\n{tail(p.log)}" for p in self.processes.values())
        raise NodeError(f"{what} not reached after {self.start_timeout:.0f}s\n{logs}")

    def claim(self) -> None:
        """Take the machine's one node slot now (start() does too): a dead node's leftovers are
        cleaned first, so a snapshot taken after this is of the host as it should be."""
        self._take_lock()

    def _take_lock(self) -> None:
        """Claim the machine's one node slot (an owner file in the binary cache, written under
        a flock): refused while a node under another root still has a live process."""
        path = cache_dir() / NODE_OWNER
        path.parent.mkdir(parents=True, exist_ok=True)
        with (cache_dir() / f"{NODE_OWNER}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(OSError, ValueError):
                owner = Path(json.loads(path.read_text())["root"])
                other = None if owner == self.root else Node.load(owner)
                if other is not None and any(p.alive() for p in other.processes.values()):
                    raise NodeError(
                        f"another node runs on this machine (root {owner}); only one can: "
                        f"stop it first (`make node-down` stops the one under .local/node)"
                    )
                if other is not None and (owner / HOST_STATE_FILE).exists():
                    # A node whose process died without stop() (a killed pytest): put the
                    # host back from its record before anything is measured or started.
                    other.stop()
            path.write_text(json.dumps({"root": str(self.root), "pid": os.getpid()}) + "\n")

    def _release_lock(self) -> None:
        path = cache_dir() / NODE_OWNER
        with contextlib.suppress(OSError, ValueError):
            if Path(json.loads(path.read_text())["root"]) == self.root:
                path.unlink()

    # persistence, so `down` works from another process
    def _write_state(self) -> None:
        state = {
            "name": self.name,
            "socket": str(self.socket),
            "plane": str(self.plane.root),
            "kube_binaries": str(self.kube_binaries),
            "node_binaries": str(self.node_binaries),
            "processes": {
                n: {"pid": p.pid, "exe": p.exe, "log": str(p.log), "start_ticks": p.start_ticks}
                for n, p in self.processes.items()
            },
        }
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, root: Path) -> Node | None:
        """A handle on the node a different process started under ``root`` (None if none)."""
        try:
            state = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        plane = ControlPlane.load(Path(state["plane"]))
        if plane is None:
            plane = ControlPlane(Path(state["plane"]), Path(state["kube_binaries"]), crd_dir=None)
        node = cls(root, plane, Path(state["kube_binaries"]), Path(state["node_binaries"]))
        for name, info in state.get("processes", {}).items():
            node.processes[name] = Process(
                name, info["exe"], int(info["pid"]), Path(info["log"]), info.get("start_ticks")
            )
        return node


@contextlib.contextmanager
def running_node(node: Node) -> Iterator[Node]:
    """Start the node for the body, stop it after (also when the body fails)."""
    node.start()
    try:
        yield node
    finally:
        node.stop()
