#!/usr/bin/env bash
# A single-box demo on a fresh Debian 12 machine, as root: a private
# containerd with locally built images, mqlet with its embedded MQTT broker,
# and a sample pod applied over MQTT. Ctrl-C stops everything it started.
#
# The cleanup must run even when stdout is gone: `make demo | tee log` and
# Ctrl-C kill tee first, and an echo into the broken pipe would end the
# script before anything is stopped. So SIGPIPE is ignored, the cleanup
# never writes to stdout, and its notes on stderr may fail harmlessly.
#
# Ctrl-C sends SIGINT to the whole foreground process group. containerd and
# mqlet run in sessions of their own (setsid), so they are still up when
# the cleanup starts: it stops mqlet, then removes every pod through the
# runtime (mqlet stop-pods: their network namespaces, veths, mounts and
# directories under the pod log dir), and only then stops containerd.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

export MQLET_TEST_DIR=${DEMO_DIR:-/run/mqlet-demo} MQLET_TEST_BRIDGE=${DEMO_BRIDGE:-mqletdemo0} MQLET_TEST_SUBNET=${DEMO_SUBNET:-10.88.78.0/24}
NODE=${NODE:-demo}
PORT=${PORT:-1883}
STATE=${MQLET_TEST_DIR}-state
MQLET_PID=""
SUB_PID=""
CRI=""

note() { echo "demo: $*" >&2 2>/dev/null || true; }

cleanup() {
	# Ignore a second Ctrl-C and a closed pipe: half a cleanup is worse.
	trap '' INT TERM PIPE
	trap - EXIT
	set +e
	note "stopping (a second Ctrl-C is ignored until the cleanup is done)"
	[ -n "$SUB_PID" ] && kill "$SUB_PID" 2>/dev/null
	if [ -n "$MQLET_PID" ] && kill "$MQLET_PID" 2>/dev/null; then
		wait "$MQLET_PID" 2>/dev/null
	fi
	if [ -n "$CRI" ] && [ -x bin/mqlet ]; then
		bin/mqlet stop-pods --cri-endpoint "$CRI" --state-dir "$STATE" --log-level warn >/dev/null 2>&1 ||
			note "some pods could not be removed through the runtime; containerd-down.sh removes what they left"
	fi
	test/env/containerd-down.sh >/dev/null 2>&1
	# Volumes mqlet mounted under its state dir go before the dir itself.
	if [ -d "$STATE" ]; then
		grep -o " $STATE/[^ ]*" /proc/mounts | sort -r | while read -r mnt; do umount -l "$mnt" 2>/dev/null; done
		rm -rf "$STATE"
	fi
	note "cleaned up"
}
trap cleanup EXIT INT TERM

MQLET_DEPS_KEEP_MOSQUITTO=1 test/env/install-deps.sh
# The demo runs its own broker and leaves a system one alone: if one
# holds the port (installing mosquitto may start it), say so instead of
# stopping it.
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
	note "port $PORT is taken (a system mosquitto?); the demo does not stop it. Run: PORT=1884 make demo"
	exit 1
fi
make -s build

CRI=$(setsid -w test/env/containerd-up.sh)
mkdir -p "$STATE"
setsid bin/mqlet --node "$NODE" --state-dir "$STATE" --cri-endpoint "$CRI" \
	--embedded-broker true --embedded-broker-listen "127.0.0.1:$PORT" \
	--broker "tcp://127.0.0.1:$PORT" --metrics-interval 30s &
MQLET_PID=$!

for _ in $(seq 50); do
	mosquitto_sub -p "$PORT" -t "mqlet/v1/$NODE/state" -C 1 -W 1 2>/dev/null | grep -q online && break
done
echo "demo: mqlet is online. Applying test/fixtures/web-pod.yaml; its replies:"
# Subscribe to the reply topic first, then send: replies are not retained,
# so a subscriber that comes later misses them.
mosquitto_sub -p "$PORT" -q 1 -t "mqlet/v1/$NODE/reply/demo-1" -C 3 -W 60 -v &
SUB_PID=$!
sleep 0.5 # mosquitto_sub has no "subscribed" signal; give it a moment
mosquitto_pub -p "$PORT" -q 1 -t "mqlet/v1/$NODE/cmd/apply/demo-1" -f test/fixtures/web-pod.yaml
wait "$SUB_PID" || true
SUB_PID=""
cat <<MSG

demo: running. In another shell:
  mosquitto_sub -p $PORT -t 'mqlet/v1/#' -v                     # watch everything
  bin/mqletctl --broker tcp://127.0.0.1:$PORT --node $NODE get pods
  bin/mqletctl --broker tcp://127.0.0.1:$PORT --node $NODE delete pod hello
Ctrl-C stops mqlet, containerd and cleans up.
MSG
wait "$MQLET_PID"
