#!/usr/bin/env bash
# Install swarm as a system service on this host (run as root):
#   - a virtualenv in $PREFIX (default /opt/swarm) with swarm and prometheus-client,
#   - the group and user "swarm" (sysusers.d) and the task-log clean-up (tmpfiles.d),
#   - /etc/swarm/keyring (a new cluster key, unless one exists: copy the same file to
#     every node of a cluster), /etc/swarm/agent.toml (unless it exists) and the
#     commented example next to it,
#   - the systemd unit swarm-agent.service, enabled and (re)started.
# Running it again upgrades swarm in place and keeps the keyring and the config.
#
# Usage: deploy/install.sh [--source DIR|WHEEL] [--wheels DIR] [--prefix DIR]
#                          [--python PYTHON] [--no-start]
#   --source  what to install: a checkout or a wheel (default: the checkout this
#             script is in)
#   --wheels  install offline, from this directory of wheels only (pip --no-index
#             --find-links); make one on a networked machine with
#             `pip wheel -w DIR 'swarm[metrics]' hatchling`
#   --no-start  install and enable, but do not start the unit now
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_spec=$(dirname "$here")
wheels=""
prefix=/opt/swarm
python=python3
start=1

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --source) source_spec=${2:?--source needs a value}; shift 2 ;;
    --wheels) wheels=${2:?--wheels needs a value}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    --no-start) start=0; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

[ "$(id -u)" = 0 ] || die "run as root (it installs a system service)"
command -v systemctl >/dev/null || die "systemctl not found: this installs a systemd service"
"$python" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
  || die "$python is missing or older than Python 3.11"

# ---------------------------------------------------------------- the venv
venv=$prefix/venv
if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  "$python" -m venv "$venv" || die "cannot create a venv (Debian/Ubuntu: apt-get install python3-venv)"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || die "--wheels $wheels is not a directory"
  pip+=(--no-index --find-links "$wheels")
fi
case "$source_spec" in
  *.whl) target="swarm[metrics] @ file://$(realpath "$source_spec")" ;;
  *) [ -f "$source_spec/pyproject.toml" ] || die "$source_spec is not a swarm checkout"
     target="swarm[metrics] @ file://$(realpath "$source_spec")" ;;
esac
say "installing swarm from $source_spec${wheels:+ (offline, wheels from $wheels)}"
"${pip[@]}" "$target" || die "pip install failed"
"$venv/bin/swarm" --version >/dev/null || die "the installed swarm does not run"
if ln -sfn "$venv/bin/swarm" /usr/local/bin/swarm 2>/dev/null; then
  say "swarm is on PATH as /usr/local/bin/swarm"
else
  say "could not link /usr/local/bin/swarm (read-only /usr?): use $venv/bin/swarm"
fi

if [ -f "$here/../docs/operations.md" ]; then
  install -D -m 0644 "$here/../docs/operations.md" "$prefix/share/doc/swarm/operations.md"
fi

# -------------------------------------------------- users, directories
install -D -m 0644 "$here/sysusers.d/swarm.conf" /etc/sysusers.d/swarm.conf
systemd-sysusers /etc/sysusers.d/swarm.conf
install -D -m 0644 "$here/tmpfiles.d/swarm.conf" /etc/tmpfiles.d/swarm.conf
systemd-tmpfiles --create /etc/tmpfiles.d/swarm.conf
install -d -m 0750 -o root -g swarm /etc/swarm

# ------------------------------------------------------ keyring, config
if [ ! -e /etc/swarm/keyring ]; then
  "$venv/bin/swarm" keygen -o /etc/swarm/keyring  # mode 0600; never replaces a key
  say "created /etc/swarm/keyring: copy this same file to every node of the cluster"
fi
chown root:root /etc/swarm/keyring
chmod 0600 /etc/swarm/keyring
install -m 0644 "$here/agent.toml.example" /etc/swarm/agent.toml.example
if [ ! -e /etc/swarm/agent.toml ]; then
  cat > /etc/swarm/agent.toml <<'EOF'
# swarm agent configuration. Every option, with its default, is in
# /etc/swarm/agent.toml.example; docs/operations.md explains them.
socket-group = "swarm"
keyring = "/etc/swarm/keyring"
EOF
  chmod 0640 /etc/swarm/agent.toml
  chgrp swarm /etc/swarm/agent.toml
  say "wrote /etc/swarm/agent.toml"
fi

# ---------------------------------------------------------------- the unit
unit=/etc/systemd/system/swarm-agent.service
sed -e "s#/opt/swarm/venv/bin/swarm#$venv/bin/swarm#" -e "s#/opt/swarm/share/#$prefix/share/#" \
  "$here/swarm-agent.service" > "$unit.new"
chmod 0644 "$unit.new"
mv "$unit.new" "$unit"
systemctl daemon-reload
systemctl enable swarm-agent.service
if [ "$start" = 1 ]; then
  systemctl restart swarm-agent.service  # returns once the agent sent READY=1
  say "swarm-agent is $(systemctl is-active swarm-agent.service)"
fi
say "done. Add users to group swarm to let them submit: usermod -aG swarm USER"
