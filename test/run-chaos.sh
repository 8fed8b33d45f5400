#!/usr/bin/env bash
# The long fault-injection run (`make chaos`): installs what it needs,
# starts a containerd of its own (/run/mqlet-chaos, bridge mqlchaos0,
# 10.88.86.0/24), runs test/chaos for 20 minutes with at least 100 kills of
# the agent (containerd paused now and then, the broker restarted), prints
# the report and stops what it started. MQLET_CHAOS_DURATION, _KILLS, _SEED
# and _BROKER_RESTARTS change the run (see test/chaos/chaos_test.go).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
WORK=$(pwd)/test/.work/chaos
# An interrupted earlier run may have left pod volume mounts in its state dir.
{ grep -o " $WORK/[^ ]*" /proc/self/mountinfo || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
rm -rf "$WORK" && mkdir -p "$WORK"

test/env/install-deps.sh

export MQLET_TEST_DIR=/run/mqlet-chaos MQLET_TEST_BRIDGE=mqlchaos0 MQLET_TEST_SUBNET=10.88.86.0/24
cleanup() { test/env/containerd-down.sh >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM
echo "== starting a private containerd ($MQLET_TEST_DIR)"
MQLET_TEST_CRI_ENDPOINT=$(test/env/containerd-up.sh 2>"$WORK/containerd-up.log")
export MQLET_TEST_CRI_ENDPOINT
export MQLET_TEST_BIN_DIR="$WORK/bin"
make -s build >/dev/null
mkdir -p "$MQLET_TEST_BIN_DIR" && cp bin/mqlet "$MQLET_TEST_BIN_DIR/"

export MQLET_CHAOS_DURATION=${MQLET_CHAOS_DURATION:-20m}
export MQLET_CHAOS_KILLS=${MQLET_CHAOS_KILLS:-100}
export MQLET_CHAOS_BROKER_RESTARTS=${MQLET_CHAOS_BROKER_RESTARTS:-4}
export MQLET_CHAOS_REPORT="$WORK/report.txt" MQLET_CHAOS_WORKDIR="$WORK"
echo "== chaos run: $MQLET_CHAOS_DURATION, at least $MQLET_CHAOS_KILLS agent kills (log: $WORK/chaos.log)"
status=0
go test -count=1 -timeout 120m -v -run '^TestChaos$' ./test/chaos/ >"$WORK/chaos.log" 2>&1 || status=$?
grep -E '^\s+chaos_test.go:[0-9]+: chaos: seed' "$WORK/chaos.log" | sed 's/^ *chaos_test.go:[0-9]*: //' || true
if [ -f "$WORK/report.txt" ]; then
	cat "$WORK/report.txt"
else
	echo "no report (the run stopped early):"; tail -40 "$WORK/chaos.log"
fi
[ "$status" -eq 0 ] && echo "chaos: every invariant held" || echo "chaos: FAILED (agent logs and state kept under $WORK)"
exit "$status"
