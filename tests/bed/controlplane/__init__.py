"""The local test control plane: a real etcd + kube-apiserver + kube-controller-manager."""

from tests.bed.controlplane.plane import (
    ControlPlane,
    ControlPlaneError,
    ensure_binaries,
    read_versions,
)

__all__ = ["ControlPlane", "ControlPlaneError", "ensure_binaries", "read_versions"]
