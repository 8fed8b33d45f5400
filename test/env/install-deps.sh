#!/usr/bin/env bash
# Installs, from Debian 12's archive, the packages mqlet's tests, demo and
# benchmarks need, skipping those already present. Run as root.
set -euo pipefail
need=()
for pkg in mosquitto mosquitto-clients containerd runc containernetworking-plugins busybox-static iptables jq docker-registry apache2-utils qemu-user-static file nats-server; do
	dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "installing: ${need[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# docker-registry's package may start a system-wide registry on :5000; the
# tests run their own on free loopback ports.
if [ -x /etc/init.d/docker-registry ] && pidof docker-registry >/dev/null 2>&1; then
	/etc/init.d/docker-registry stop >/dev/null 2>&1 || true
fi
# The Debian package may start a system-wide mosquitto; the tests run their
# own brokers and stop it, saying so. The demo keeps it (it checks its port).
if [ -z "${MQLET_DEPS_KEEP_MOSQUITTO:-}" ] && pidof mosquitto >/dev/null 2>&1 && [ -x /etc/init.d/mosquitto ]; then
	echo "install-deps: stopping the system mosquitto (/etc/init.d/mosquitto start brings it back)" >&2
	/etc/init.d/mosquitto stop >/dev/null 2>&1 || true
fi
