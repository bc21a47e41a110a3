# Local clusters (included by the top Makefile, which defines PY).
# cluster-*: etcd + kube-apiserver + kube-controller-manager on loopback (tests/controlplane);
# kind-*: a kind cluster for users with a Docker engine (tests/kind). Kubeconfigs go to .local/.
.PHONY: cluster-up cluster-down kind-up kind-down

cluster-up: install ## start (or reuse) the local control plane; admin kubeconfig in .local/kubeconfig
	$(PY) -m tests.controlplane up

cluster-down: install ## stop the local control plane
	$(PY) -m tests.controlplane down

kind-up: ## create (or reuse) kind cluster "projector" (needs Docker); .local/kind-kubeconfig
	tests/kind/kind.sh up

kind-down: ## delete the kind cluster
	tests/kind/kind.sh down
