#!/usr/bin/env bash
# Stops the containerd started by containerd-up.sh for MQLET_TEST_DIR and
# removes what its pods left behind (tasks, shims, netns, CNI state, bridge,
# per-pod iptables chains) and the scratch dir. Safe to run twice.
set -uo pipefail

DIR=${MQLET_TEST_DIR:-/run/mqlet-test}
if [ -f "$DIR/settings" ]; then
	# shellcheck disable=SC1091
	. "$DIR/settings"
fi
BRIDGE=${MQLET_TEST_BRIDGE:-${SAVED_BRIDGE:-mqlet0}}
SUBNET=${MQLET_TEST_SUBNET:-${SAVED_SUBNET:-10.88.77.0/24}}
SOCK="$DIR/containerd.sock"
PIDFILE="$DIR/containerd.pid"

log() { echo "containerd-down: $*" >&2; }

[ -d "$DIR" ] || { log "nothing to do ($DIR does not exist)"; exit 0; }

pid=""
[ -f "$PIDFILE" ] && pid=$(cat "$PIDFILE")

# Network namespaces of this instance's sandboxes, read from their OCI specs.
netns=()
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && ctr -a "$SOCK" --timeout 2s version >/dev/null 2>&1; then
	for id in $(ctr -n k8s.io -a "$SOCK" containers ls -q 2>/dev/null); do
		path=$(ctr -n k8s.io -a "$SOCK" containers info "$id" 2>/dev/null |
			jq -r '.Spec.linux.namespaces[]? | select(.type == "network") | .path // empty' 2>/dev/null || true)
		[ -n "$path" ] && netns+=("$path")
		ctr -n k8s.io -a "$SOCK" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
	done
	for id in $(ctr -n k8s.io -a "$SOCK" tasks ls -q 2>/dev/null); do
		ctr -n k8s.io -a "$SOCK" tasks delete -f "$id" >/dev/null 2>&1 || true
	done
fi

if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
	log "stopping containerd (pid $pid)"
	kill -TERM "$pid"
	for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
fi

# Shims of this instance carry its socket address on their command line.
# Their children are the containers' processes: kill those first, since a
# killed shim leaves its container running, reparented to init.
kill_tree() {
	local child
	for child in $(pgrep -P "$1" || true); do
		kill_tree "$child"
	done
	kill -KILL "$1" 2>/dev/null || true
}
for shim in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK( |$)" || true); do
	kill_tree "$shim"
done

# Pod cgroups left empty by the killed containers. Other instances share the
# /mqlet parent, but a cgroup in use refuses rmdir, so only empty ones go.
for dir in /sys/fs/cgroup/*/mqlet/pod*/ /sys/fs/cgroup/mqlet/pod*/; do
	[ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null
done

for path in "${netns[@]}"; do
	name=$(basename "$path")
	ip netns delete "$name" 2>/dev/null || { umount "$path" 2>/dev/null; rm -f "$path"; }
done

# CNI result cache entries of this network.
rm -f /var/lib/cni/results/mqlet-test-"$BRIDGE"-* 2>/dev/null || true

# Per-pod portmap chains that point into our subnet; then the shared hostport
# chains only if nothing else uses them any more.
if command -v iptables >/dev/null; then
	prefix=${SUBNET%.*}
	for chain in $(iptables -t nat -S 2>/dev/null | awk '/^-N CNI-DN-/ {print $2}'); do
		if iptables -t nat -S "$chain" 2>/dev/null | grep -q -- "--to-destination $prefix\."; then
			iptables -t nat -S CNI-HOSTPORT-DNAT 2>/dev/null | grep -- "-j $chain" | sed 's/^-A/-D/' |
				while read -r rule; do eval iptables -t nat "$rule" 2>/dev/null; done
			iptables -t nat -F "$chain" 2>/dev/null; iptables -t nat -X "$chain" 2>/dev/null
		fi
	done
	if ! iptables -t nat -S CNI-HOSTPORT-DNAT 2>/dev/null | grep -q '^-A'; then
		for parent in PREROUTING OUTPUT; do
			iptables -t nat -S "$parent" 2>/dev/null | grep -- '-j CNI-HOSTPORT-DNAT' | sed 's/^-A/-D/' |
				while read -r rule; do eval iptables -t nat "$rule" 2>/dev/null; done
		done
		iptables -t nat -S POSTROUTING 2>/dev/null | grep -- '-j CNI-HOSTPORT-MASQ' | sed 's/^-A/-D/' |
			while read -r rule; do eval iptables -t nat "$rule" 2>/dev/null; done
		for chain in CNI-HOSTPORT-DNAT CNI-HOSTPORT-SETMARK CNI-HOSTPORT-MASQ; do
			iptables -t nat -F "$chain" 2>/dev/null; iptables -t nat -X "$chain" 2>/dev/null
		done
	fi
fi

ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE" 2>/dev/null

# Mounts left under the scratch dir (rootfs, shm) must go before rm -rf.
grep -o " $DIR/[^ ]*" /proc/mounts | sort -r | while read -r mnt; do umount -l "$mnt" 2>/dev/null; done
rm -rf "$DIR"
log "done"
exit 0
