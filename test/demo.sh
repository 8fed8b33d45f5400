#!/usr/bin/env bash
# A single-box demo on a fresh Debian 12 machine, as root: a private
# containerd with locally built images, mqlet with its embedded MQTT broker,
# and a sample pod applied over MQTT. Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
test/env/install-deps.sh
make -s build

export MQLET_TEST_DIR=/run/mqlet-demo MQLET_TEST_BRIDGE=mqletdemo0 MQLET_TEST_SUBNET=10.88.78.0/24
NODE=${NODE:-demo}
PORT=${PORT:-1883}
STATE=/run/mqlet-demo-state
MQLET_PID=""
cleanup() {
	trap - EXIT INT TERM
	echo; echo "demo: stopping"
	[ -n "$MQLET_PID" ] && kill "$MQLET_PID" 2>/dev/null && wait "$MQLET_PID" 2>/dev/null || true
	test/env/containerd-down.sh >/dev/null 2>&1 || true
	rm -rf "$STATE"
}
trap cleanup EXIT INT TERM

CRI=$(test/env/containerd-up.sh)
mkdir -p "$STATE"
bin/mqlet --node "$NODE" --state-dir "$STATE" --cri-endpoint "$CRI" \
	--embedded-broker true --embedded-broker-listen "127.0.0.1:$PORT" \
	--broker "tcp://127.0.0.1:$PORT" --metrics-interval 30s &
MQLET_PID=$!

for _ in $(seq 50); do
	mosquitto_sub -p "$PORT" -t "mqlet/v1/$NODE/state" -C 1 -W 1 2>/dev/null | grep -q online && break
done
echo "demo: mqlet is online. Applying test/fixtures/web-pod.yaml; its replies:"
mosquitto_sub -p "$PORT" -q 1 -t "mqlet/v1/$NODE/reply/demo-1" -C 3 -W 60 -v &
SUB_PID=$!
sleep 0.5 # let the subscription settle before the command goes out
mosquitto_pub -p "$PORT" -q 1 -t "mqlet/v1/$NODE/cmd/apply/demo-1" -f test/fixtures/web-pod.yaml
wait "$SUB_PID" || true
cat <<MSG

demo: running. In another shell:
  mosquitto_sub -p $PORT -t 'mqlet/v1/#' -v                     # watch everything
  mosquitto_pub -p $PORT -q 1 -t mqlet/v1/$NODE/cmd/get/q1 -m '{}'
  mosquitto_pub -p $PORT -q 1 -t mqlet/v1/$NODE/cmd/delete/d1 -m '{"kind":"Pod","name":"hello"}'
Ctrl-C stops mqlet, containerd and cleans up.
MSG
wait "$MQLET_PID"
