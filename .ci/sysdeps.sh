#!/usr/bin/env bash
# Install the system tools that the root-only tests use (namespaces, nftables, tc,
# systemd-nspawn, a C compiler). Best effort: without root or apt the tests that need them skip
# with a stated reason.
set -u
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# a C compiler: root agents build swarm-exec with it, and the security tests build a
# preloaded library (without one, agents fall back to a slower start, tests skip)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "sysdeps: not root or no apt-get; tests needing ${need[*]} will skip" >&2
  exit 0
fi
echo "sysdeps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || {
  apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${need[@]}" >/dev/null 2>&1
} || echo "sysdeps: could not install ${need[*]}; dependent tests will skip" >&2
exit 0
