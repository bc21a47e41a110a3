# The local node (included by the top Makefile): kubelet + containerd + runc joined to the local
# control plane (tests/node). Debian's packages come from this rule, never by hand: apt-get as
# root, only the missing ones, so a second run does nothing.
.PHONY: node-packages node-binaries node-up node-down

NODE_PACKAGES := runc umoci skopeo buildah debootstrap containernetworking-plugins busybox-static gcc libc6-dev iproute2 iptables nftables

node-packages: ## install (only if missing) Debian's runc, umoci, skopeo, buildah, debootstrap, CNI plugins, busybox
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make node-packages: not root, cannot install $$missing (apt-get); the node tier will skip, saying so" >&2; exit 0; fi; \
	  echo "make node-packages: installing $$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	fi

node-binaries: node-packages ## build (or reuse) kubelet, containerd (+shim, ctr) and the pause binary
	tests/node/build.sh >/dev/null

node-up: install binaries node-binaries ## start (or reuse) the control plane and a node; .local/node.env
	$(PY) -m tests.node up

node-down: install ## stop the node (and put back everything it changed on the host)
	$(PY) -m tests.node down
