#!/usr/bin/env bash
# Installs the Debian packages a local one-node cluster (hack/cluster) needs,
# when any is missing: containerd and runc run the pods, the CNI plugins wire
# them to a bridge, iptables and conntrack serve kube-proxy, iproute2 and
# util-linux (ip, nsenter) build the node's network namespace.
# Idempotent: with everything present it only checks.
set -euo pipefail

"$(dirname "$0")/install-debian-deps.sh" \
  containerd=containerd ctr=containerd runc=runc \
  iptables=iptables conntrack=conntrack ip=iproute2 nsenter=util-linux \
  /usr/lib/cni/bridge=containernetworking-plugins /usr/lib/cni/host-local=containernetworking-plugins \
  /usr/lib/cni/loopback=containernetworking-plugins /usr/lib/cni/portmap=containernetworking-plugins
echo "node packages present"
