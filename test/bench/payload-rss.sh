#!/usr/bin/env bash
# Peak RSS (VmHWM) of mqlet handling the largest payloads it takes: a 1 MiB
# List of 256 ConfigMaps (decoded), the densest 1 MiB YAML (refused by the
# value bound) and a 700 KB alias bomb (refused by the expanded-size bound).
# Each runs against a fresh mqlet with its embedded broker and no CRI.
#   test/bench/payload-rss.sh            (after make build; needs mosquitto-clients, python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin/mqlet}
work=$(mktemp -d)
pid="" sub=""
stop() { kill $sub $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; }
trap 'stop; rm -rf "$work"' EXIT
(cd "$work" && python3 "$OLDPWD/test/bench/payloads/gen.py")
for f in list.yaml dense.yaml bomb.yaml; do
	d=$(mktemp -d -p "$work")
	port=$((20000 + RANDOM % 20000))
	"$BIN" --node rss --state-dir "$d" --embedded-broker=true --embedded-broker-listen=127.0.0.1:$port \
		--broker tcp://127.0.0.1:$port --cri-endpoint "unix://$d/none.sock" --log-level warn >"$d/log" 2>&1 &
	pid=$!
	for _ in $(seq 1 100); do # until the embedded broker listens and mqlet is online
		mosquitto_sub -p $port -t mqlet/v1/rss/state -C 1 -W 5 2>/dev/null | grep -q online && break
		sleep 0.1
	done
	base=$(awk '/VmHWM/{print $2}' /proc/$pid/status)
	mosquitto_sub -p $port -t mqlet/v1/rss/reply/r1 -W 60 >"$d/replies" &
	sub=$!
	sleep 0.3 # the subscription is set up before the command goes out
	mosquitto_pub -p $port -q 1 -t mqlet/v1/rss/cmd/apply/r1 -f "$work/$f"
	for _ in $(seq 1 600); do grep -q '"phase":"\(failed\|succeeded\)"' "$d/replies" && break; sleep 0.1; done
	peak=$(awk '/VmHWM/{print $2}' /proc/$pid/status)
	phase=$(grep -o '"phase":"[a-z_]*"' "$d/replies" | tail -1 | cut -d'"' -f4)
	printf '%-10s %8d bytes  VmHWM %6d kB before, %6d kB after  reply %s\n' "$f" "$(stat -c %s "$work/$f")" "$base" "$peak" "$phase"
	stop
done
