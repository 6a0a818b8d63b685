#!/usr/bin/env bash
# Installs the Debian packages that provide the given commands or files,
# when any is missing. Arguments are WHAT=PACKAGE pairs, WHAT being a command
# name or an absolute path, e.g. promtool=prometheus
# /usr/lib/cni/bridge=containernetworking-plugins.
# Idempotent: with everything present it only checks. Not root and something
# missing: it says what to install and fails, so a test never silently runs
# without a tool it needs.
set -euo pipefail

missing=()
for pair in "$@"; do
  what=${pair%%=*} pkg=${pair#*=}
  if [[ $what == /* ]]; then [[ -x $what ]] && continue
  else command -v "$what" >/dev/null 2>&1 && continue
  fi
  missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]]; then
  echo "missing Debian packages: ${pkgs[*]}; install them as root: apt-get install -y ${pkgs[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
