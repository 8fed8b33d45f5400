#!/usr/bin/env bash
# Starts a private containerd (CRI plugin, runc, CNI bridge) for tests and
# imports the locally built busybox and pause images. Idempotent: when the
# instance of this MQLET_TEST_DIR already answers, it only re-imports images.
#
# Environment:
#   MQLET_TEST_DIR     scratch dir (default /run/mqlet-test)
#   MQLET_TEST_BRIDGE  bridge name (default mqlet0)
#   MQLET_TEST_SUBNET  pod subnet (default 10.88.77.0/24)
# Registries: tests write $MQLET_TEST_DIR/certs.d/<host:port>/hosts.toml
# (containerd's hosts.d), read by containerd at every pull.
# Prints the CRI endpoint (unix://$MQLET_TEST_DIR/containerd.sock) on stdout.
set -euo pipefail

DIR=${MQLET_TEST_DIR:-/run/mqlet-test}
# A restart of an existing instance keeps its network unless told otherwise.
if [ -f "$DIR/settings" ]; then
	# shellcheck disable=SC1091
	. "$DIR/settings"
fi
BRIDGE=${MQLET_TEST_BRIDGE:-${SAVED_BRIDGE:-mqlet0}}
SUBNET=${MQLET_TEST_SUBNET:-${SAVED_SUBNET:-10.88.77.0/24}}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SOCK="$DIR/containerd.sock"
PIDFILE="$DIR/containerd.pid"
PAUSE_IMAGE=${MQLET_PAUSE_IMAGE:-docker.io/mqlet/pause:test}

log() { echo "containerd-up: $*" >&2; }

install_missing() {
	local missing=()
	command -v containerd >/dev/null || missing+=(containerd)
	command -v runc >/dev/null || missing+=(runc)
	[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
	[ -x /bin/busybox ] || missing+=(busybox-static)
	command -v iptables >/dev/null || missing+=(iptables)
	command -v jq >/dev/null || missing+=(jq)
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2
		apt-get install -y -qq containerd runc containernetworking-plugins busybox-static iptables jq >&2
	fi
}

answers() {
	ctr -a "$SOCK" --timeout 2s version >/dev/null 2>&1
}

write_config() {
	mkdir -p "$DIR/root" "$DIR/state" "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/images" "$DIR/certs.d"
	cat >"$DIR/cni/net.d/10-mqlet-test.conflist" <<CONF
{
  "cniVersion": "1.0.0",
  "name": "mqlet-test-$BRIDGE",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
CONF
	cat >"$DIR/config.toml" <<CONF
version = 2
root = "$DIR/root"
state = "$DIR/state"

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
    # A second handler on the same runc, for runtimeClassName tests
    # (runtime.classes maps a class to it). crun fails on these hosts
    # (hybrid cgroup v1 + v2 mounts), so the second handler is runc again.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-b]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-b.options]
        SystemdCgroup = false
  # Registry hosts (CA, plain HTTP, mirrors) are read from certs.d/<host>/hosts.toml
  # at every pull, so tests add registries without restarting containerd; an
  # empty directory changes nothing.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$DIR/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
    max_conf_num = 1
CONF
}

start() {
	if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && answers; then
		log "already running (pid $(cat "$PIDFILE"))"
		return
	fi
	write_config
	log "starting containerd for $DIR"
	containerd --config "$DIR/config.toml" >>"$DIR/containerd.log" 2>&1 &
	echo $! >"$PIDFILE"
	for _ in $(seq 1 100); do
		answers && return
		kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { log "containerd exited; see $DIR/containerd.log"; tail -20 "$DIR/containerd.log" >&2; exit 1; }
		sleep 0.1
	done
	log "containerd did not answer on $SOCK within 10s"
	exit 1
}

import_images() {
	"$REPO/test/images/build.sh" "$DIR/images" >&2
	for image in pause busybox grpchealth; do
		ctr -n k8s.io -a "$SOCK" images import "$DIR/images/$image.tar" >&2
	done
}

install_missing
mkdir -p "$DIR"
printf 'SAVED_BRIDGE=%s\nSAVED_SUBNET=%s\n' "$BRIDGE" "$SUBNET" >"$DIR/settings"
start
import_images
echo "unix://$SOCK"
