#!/usr/bin/env bash
# System packages the code environments need, installed only when missing:
#   bubblewrap + util-linux (setpriv, prlimit) + mount (tmpfs workdir budgets) + git, and Debian's python3 with pytest, which the
#   unprivileged sandbox uids can read (the project venv's interpreter lives under /root, 0700).
#   --containers adds podman, runc (crun fails on these machines' cgroups) and debootstrap.
# Without root or apt-get it only warns: the sandbox tests then skip with a reason.
set -euo pipefail

pkgs=(bubblewrap util-linux mount git python3 python3-pytest)
if [[ "${1:-}" == "--containers" ]]; then
  pkgs+=(podman runc debootstrap)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "warning: missing system packages: ${missing[*]} (need root + apt-get); sandbox tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
}
echo "installed: ${missing[*]}"
