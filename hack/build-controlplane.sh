#!/usr/bin/env bash
# Builds the real Kubernetes binaries from the Go module proxy into
# bin/k8s/<version>-linux-amd64/: the control plane (kube-apiserver, kubectl,
# etcd) and what a node and its controllers need (kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy; hack/cluster runs them). envtest's usual
# download of prebuilt binaries is not reachable here, so we compile them from
# the nested modules hack/k8s-build and hack/etcd-build.
#
# Idempotent: when the binaries for these versions exist (and a stamp file
# records the versions they were built from) it returns in well under a second.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.1}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${CONTROLPLANE_DIR:-$root/bin/k8s/${K8S_VERSION}-$(go env GOOS)-$(go env GOARCH)}
stamp="$out/.built-from"
k8s_cmds=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy)
want="kubernetes=${K8S_VERSION} etcd=${ETCD_VERSION} cmds=${k8s_cmds[*]}"

all_present() {
  local b
  for b in "${k8s_cmds[@]}" etcd; do [[ -x $out/$b ]] || return 1; done
}
if all_present && [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  echo "control plane binaries up to date in $out ($want)"
  exit 0
fi

# The nested go.mod files pin the versions; refuse to build something other
# than what the caller asked for rather than silently mixing versions.
grep -qE "k8s.io/kubernetes ${K8S_VERSION}( |\$)" "$root/hack/k8s-build/go.mod" ||
  { echo "hack/k8s-build/go.mod does not require k8s.io/kubernetes ${K8S_VERSION}" >&2; exit 1; }
grep -qE "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}( |\$)" "$root/hack/etcd-build/go.mod" ||
  { echo "hack/etcd-build/go.mod does not require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}" >&2; exit 1; }

mkdir -p "$out"
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${minor} \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"

start=$SECONDS
echo "building ${k8s_cmds[*]} ${K8S_VERSION} (a cold build takes 10-15 minutes on 2 cores)"
(cd "$root/hack/k8s-build" && go build -trimpath -ldflags "$ldflags" -o "$out/" \
  "${k8s_cmds[@]/#/k8s.io/kubernetes/cmd/}")
echo "building etcd ${ETCD_VERSION}"
(cd "$root/hack/etcd-build" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
echo "$want" > "$stamp"
echo "control plane binaries built in $((SECONDS - start))s into $out"
