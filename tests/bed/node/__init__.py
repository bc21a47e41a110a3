"""The local node: kubelet + containerd + runc joined to the local control plane (docs/node.md)."""
