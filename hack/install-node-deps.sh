#!/usr/bin/env bash
# Installs the Debian packages a local one-node cluster (hack/cluster) needs,
# when any is missing: containerd and runc run the pods, the CNI plugins wire
# them to a bridge, iptables and conntrack serve kube-proxy, iproute2 and
# util-linux (ip, nsenter) build the node's network namespace.
# Idempotent: with everything present it only checks.
set -euo pipefail

declare -A provides=(
  [containerd]=containerd [ctr]=containerd [runc]=runc
  [iptables]=iptables [conntrack]=conntrack [ip]=iproute2 [nsenter]=util-linux
  [/usr/lib/cni/bridge]=containernetworking-plugins [/usr/lib/cni/host-local]=containernetworking-plugins
  [/usr/lib/cni/loopback]=containernetworking-plugins [/usr/lib/cni/portmap]=containernetworking-plugins
)
missing=()
for what in "${!provides[@]}"; do
  if [[ $what == /* ]]; then [[ -x $what ]] && continue
  else command -v "$what" >/dev/null 2>&1 && continue
  fi
  missing+=("${provides[$what]}")
done
[[ ${#missing[@]} -eq 0 ]] && { echo "node packages present"; exit 0; }
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]]; then
  echo "missing Debian packages for the local node: ${pkgs[*]}; install them as root: apt-get install -y ${pkgs[*]}" >&2
  exit 1
fi
echo "installing Debian packages for the local node: ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
