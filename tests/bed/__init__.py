"""The test bed: what `make` runs to build, start, render and generate, and what the tests, the
demo and the benchmarks stand on. Here are the local control plane (`controlplane`: etcd and the
kube-* binaries built from their Go modules, `make binaries`, `make cluster-up`) and node
(`node`: kubelet + containerd + runc, the images built without a registry, `make node-up`,
`make image`), the builds and harnesses of Prometheus and the OpenTelemetry Collector
(`prometheus`, `otel`), helm and the chart renderer (`helm`, `make manifests`), the kind script
(`kind`), the observability generators (`observability`, `make generate`), the demo (`demo`,
`make demo`), the launcher of `projector run` processes (`launcher`), the TCP relay that fault
tests break (`proxy`) and the official client as they all use it (`kube`: waiting, names, the
shipped RBAC). It holds no tests, and imports nothing from the test suite: the tests and
`benchmarks/` import it, never the reverse (`tests/support.py` is the tests' own helper).
"""
