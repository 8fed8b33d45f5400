#!/usr/bin/env bash
# The benchmark (`make bench`). On a Debian 12 machine as root it installs
# what test/run-tests.sh installs (nothing more), starts a private containerd
# on its own socket and bridge, builds mqlet, runs `go run ./test/bench`
# (footprint, memory at rest with 0, 20 and 50 pods, command intake, pod
# start vs raw CRI made one after another and in parallel, idle telemetry,
# delete of the running pods, exit → status delay), prints the report (JSON
# in test/.work/bench.json) and stops everything it started, also when
# interrupted.
# Extra arguments go to the bench command, e.g. `test/run-bench.sh --duration 20s`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
WORK=$(pwd)/test/.work
mkdir -p "$WORK"

test/env/install-deps.sh

# A containerd of its own, so the bench neither disturbs nor is disturbed by
# the tests' instance.
# (MQLET_TEST_DIR, MQLET_TEST_BRIDGE and MQLET_TEST_SUBNET override where.)
export MQLET_TEST_DIR=${MQLET_TEST_DIR:-/run/mqlet-bench}
export MQLET_TEST_BRIDGE=${MQLET_TEST_BRIDGE:-mqbench0}
export MQLET_TEST_SUBNET=${MQLET_TEST_SUBNET:-10.88.92.0/24}
cleanup() { test/env/containerd-down.sh >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM

echo "== starting a private containerd"
MQLET_TEST_CRI_ENDPOINT=$(test/env/containerd-up.sh 2>"$WORK/containerd-up.log") || {
	echo "containerd did not start:"; tail -20 "$WORK/containerd-up.log"; exit 1
}
export MQLET_TEST_CRI_ENDPOINT

echo "== building"
if ! make -s build >"$WORK/build.log" 2>&1; then
	# mqletctl may be mid-work; the bench needs only mqlet.
	CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -o bin/mqlet ./cmd/mqlet
fi
# make build strips symbols; an unstripped build of the same source gives the size comparison.
CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -o "$WORK/mqlet.unstripped" ./cmd/mqlet
go build -o "$WORK/bench" ./test/bench

echo "== running the benchmark (about 3 minutes)"
"$WORK/bench" --mqlet bin/mqlet --cri-endpoint "$MQLET_TEST_CRI_ENDPOINT" --out "$WORK/bench.json" --work-dir "$WORK" \
	--unstripped "$WORK/mqlet.unstripped" "$@"
