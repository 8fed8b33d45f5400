#!/usr/bin/env bash
# The idle heap of mqlet: builds it with -tags heapprofile, starts it with
# its embedded broker (and the CRI endpoint of $MQLET_TEST_CRI_ENDPOINT if
# set), lets it idle, writes a heap profile (SIGUSR1) and prints its top
# entries, with the process's RSS split into anonymous and file pages.
#   test/size/idle-heap.sh [seconds idle, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/go/bin:$PATH
idle=${1:-10}
work=$(mktemp -d /tmp/mqlet-idle-heap.XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
CGO_ENABLED=0 go build -trimpath -tags 'grpcnotrace heapprofile' -o "$work/mqlet" ./cmd/mqlet
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/logs"
cat >"$work/mqlet.yaml" <<CONF
runtime:
  podLogDir: $work/logs
embeddedBroker:
  enabled: true
  listen: 127.0.0.1:$port
mqtt:
  broker: tcp://127.0.0.1:$port
CONF
GODEBUG=memprofilerate=512 MQLET_HEAPPROFILE="$work/heap.pprof" "$work/mqlet" --config "$work/mqlet.yaml" --node idle-heap \
	--state-dir "$work/state" --cri-endpoint "${MQLET_TEST_CRI_ENDPOINT:-unix:///run/containerd/containerd.sock}" \
	--log-level warn 2>"$work/mqlet.log" &
pid=$!
sleep "$idle"
echo "RSS (the profiler, sampling every 512 bytes, adds to the anonymous part):"
grep -E '^(VmRSS|RssAnon|RssFile)' "/proc/$pid/status"
kill -USR1 "$pid"
for _ in $(seq 50); do [ -s "$work/heap.pprof" ] && break; sleep 0.1; done
sleep 0.5
go tool pprof -sample_index=inuse_space -top -nodecount=25 "$work/mqlet" "$work/heap.pprof" 2>/dev/null | sed -n '1,40p'
