#!/usr/bin/env bash
# Installs mqlet on a Debian 12 gateway as root: packages, binaries, config,
# systemd unit. Run from a checkout after `make build`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/mqlet ] || { echo "run make build first" >&2; exit 1; }
apt-get install -y containerd runc containernetworking-plugins
install -m 0755 bin/mqlet /usr/local/bin/mqlet
[ -x bin/mqletctl ] && install -m 0755 bin/mqletctl /usr/local/bin/mqletctl
install -d -m 0700 /etc/mqlet
[ -f /etc/mqlet/mqlet.yaml ] || install -m 0600 configs/mqlet.yaml /etc/mqlet/mqlet.yaml
[ -f /etc/containerd/config.toml ] || install -D -m 0644 deploy/containerd-config.toml /etc/containerd/config.toml
install -m 0644 deploy/mqlet.service /etc/systemd/system/mqlet.service
if pidof systemd >/dev/null; then
	systemctl daemon-reload
	systemctl enable --now containerd mqlet
else
	echo "systemd is not running: start containerd and /usr/local/bin/mqlet --config /etc/mqlet/mqlet.yaml yourself"
fi
echo "installed; edit /etc/mqlet/mqlet.yaml (node, broker, TLS) and restart mqlet"
