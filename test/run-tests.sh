#!/usr/bin/env bash
# The whole test suite, as CI runs it (`make test`). On a fresh Debian 12
# machine as root it installs what the tests need (mosquitto, containerd,
# runc, CNI plugins, busybox-static), starts a private containerd on a scratch
# socket, runs every Go test with the race detector plus short fuzz runs, and
# stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
WORK=$(pwd)/test/.work
mkdir -p "$WORK"

test/env/install-deps.sh

echo "== gofmt / go vet"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "not gofmt'ed:"; echo "$unformatted"; exit 1
fi
go vet ./...

export MQLET_TEST_DIR=/run/mqlet-ci
# The fault-injection run (test/chaos) has a containerd, bridge and subnet of
# its own: it pauses that containerd and kills only the mqlet it started, so
# it runs beside the serial packages without touching them.
chaos_env() { env MQLET_TEST_DIR=/run/mqlet-ci-chaos MQLET_TEST_BRIDGE=mqlcic0 MQLET_TEST_SUBNET=10.88.88.0/24 "$@"; }
# The fleet tests run members of one group, each on a containerd of its own
# (members run pods of the same name): two more, beside the shared one.
fleet_env() { env MQLET_TEST_DIR=/run/mqlet-ci-fleet$1 MQLET_TEST_BRIDGE=mqlcif$1 MQLET_TEST_SUBNET=10.88.$((94 + $1)).0/24 "${@:2}"; }
# The end-to-end tests run in E2E_SHARDS lanes at once, each lane on a
# containerd, bridge and subnet of its own (a test of one lane may stop,
# pause or restart its containerd without touching another lane); the cri
# package runs beside them on the shared one.
E2E_SHARDS=${E2E_SHARDS:-3}
e2e_env() { env MQLET_TEST_DIR=/run/mqlet-ci-e2e$1 MQLET_TEST_BRIDGE=mqlcie$1 MQLET_TEST_SUBNET=10.88.$((97 + $1)).0/24 "${@:2}"; }
cleanup() {
	test/env/containerd-down.sh >/dev/null 2>&1 || true
	chaos_env test/env/containerd-down.sh >/dev/null 2>&1 || true
	fleet_env 1 test/env/containerd-down.sh >/dev/null 2>&1 || true
	fleet_env 2 test/env/containerd-down.sh >/dev/null 2>&1 || true
	for ((i = 1; i <= E2E_SHARDS; i++)); do e2e_env "$i" test/env/containerd-down.sh >/dev/null 2>&1 || true; done
}
trap cleanup EXIT INT TERM
echo "== starting a private containerd"
MQLET_TEST_CRI_ENDPOINT=$(test/env/containerd-up.sh)
export MQLET_TEST_CRI_ENDPOINT
CHAOS_CRI_ENDPOINT=$(chaos_env test/env/containerd-up.sh)
MQLET_TEST_CRI_ENDPOINTS_FLEET=$(fleet_env 1 test/env/containerd-up.sh),$(fleet_env 2 test/env/containerd-up.sh)
export MQLET_TEST_CRI_ENDPOINTS_FLEET
E2E_ENDPOINTS=()
for ((i = 1; i <= E2E_SHARDS; i++)); do E2E_ENDPOINTS[i]=$(e2e_env "$i" test/env/containerd-up.sh); done
export MQLET_TEST_BIN_DIR="$WORK/bin"
make -s build >/dev/null
# The size guard (cheap: the binaries were just built): a stripped binary
# more than 5 % over test/size/sizes.txt fails the run.
echo "== binary sizes against test/size/sizes.txt"
size_status=0
go run ./test/size check bin/mqlet bin/mqletctl || size_status=1
mkdir -p "$MQLET_TEST_BIN_DIR" && cp bin/mqlet* "$MQLET_TEST_BIN_DIR/"

# Packages that stop and start a containerd run after the rest (which run
# in parallel): cri on the shared containerd, test/e2e in shards on their
# own, test/chaos on its own, all at once.
parallel=$(go list ./... | grep -v -x -F -e github.com/mqlet/mqlet/cri -e github.com/mqlet/mqlet/test/e2e -e github.com/mqlet/mqlet/test/chaos)
status=$size_status
echo "== go test -race (unit and integration)"
go test -race -count=1 -timeout 20m -v $parallel >"$WORK/test.log" 2>&1 || status=$?
echo "== fault-injection run (test/chaos, ~3 min, its own containerd) in the background"
{ grep -o " $WORK/chaos/[^ ]*" /proc/self/mountinfo || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
rm -rf "$WORK/chaos" && mkdir -p "$WORK/chaos"
chaos_env MQLET_TEST_CRI_ENDPOINT="$CHAOS_CRI_ENDPOINT" MQLET_CHAOS_WORKDIR="$WORK/chaos" MQLET_CHAOS_REPORT="$WORK/chaos/report.txt" \
	go test -race -count=1 -timeout 30m -v ./test/chaos/ >"$WORK/chaos.log" 2>&1 &
lanes=($!)
lane_logs=("$WORK/chaos.log")
echo "== go test -race: cri, and test/e2e in $E2E_SHARDS shards, each on its own containerd"
go test -race -count=1 -timeout 40m -v ./cri/ >"$WORK/cri.log" 2>&1 &
lanes+=($!) lane_logs+=("$WORK/cri.log")
# One test binary for every shard. Tests go to shards longest first, each
# to the shard with the least work so far, by the seconds of a recent run
# in test/e2e/durations.txt (a test not listed counts 15 s).
go test -race -c -o "$WORK/e2e.test" ./test/e2e/
(cd test/e2e && "$WORK/e2e.test" -test.list '.*' | grep '^Test') >"$WORK/e2e-tests.txt"
awk -v n="$E2E_SHARDS" 'NR == FNR { secs[$1] = $2; next } { print (($1 in secs) ? secs[$1] : 15), $1 }' \
	test/e2e/durations.txt "$WORK/e2e-tests.txt" | sort -k1,1nr -k2 |
	awk -v n="$E2E_SHARDS" '{ best = 1; for (i = 2; i <= n; i++) if (load[i] < load[best]) best = i; load[best] += $1; print best, $2 }' >"$WORK/e2e-shards.txt"
for ((i = 1; i <= E2E_SHARDS; i++)); do
	mapfile -t names < <(awk -v i="$i" '$1 == i { print $2 }' "$WORK/e2e-shards.txt")
	pattern="^($(IFS='|'; echo "${names[*]}"))\$"
	(
		cd test/e2e
		if e2e_env "$i" MQLET_TEST_CRI_ENDPOINT="${E2E_ENDPOINTS[i]}" "$WORK/e2e.test" -test.v -test.count=1 -test.timeout 40m -test.run "$pattern"; then
			echo "ok  	github.com/mqlet/mqlet/test/e2e (shard $i of $E2E_SHARDS, ${#names[@]} tests)"
		else
			echo "FAIL	github.com/mqlet/mqlet/test/e2e (shard $i of $E2E_SHARDS)"
			exit 1
		fi
	) >"$WORK/e2e-$i.log" 2>&1 &
	lanes+=($!) lane_logs+=("$WORK/e2e-$i.log")
done
for pid in "${lanes[@]}"; do wait "$pid" || status=$?; done
for log in "${lane_logs[@]}"; do cat "$log" >>"$WORK/test.log"; done
if [ -f "$WORK/chaos/report.txt" ]; then cat "$WORK/chaos/report.txt"; else echo "chaos: no report:"; tail -30 "$WORK/chaos.log"; fi
grep -E '^(ok|FAIL|---|panic:)|^\s+--- FAIL' "$WORK/test.log" | grep -v -- '--- PASS' || true

echo "== release: cross builds under qemu, the .deb installed with a pod, upgrade, purge"
test/release-tests.sh >"$WORK/release.log" 2>&1 || status=$?
grep '^release' "$WORK/release.log" || true

echo "== fuzzing the command decoder and intake briefly"
# A count (Nx), not a duration: Go 1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure when a worker is slow to stop (go.dev/issue/75804).
for spec in agent/manifest:FuzzDecode agent/manifest:FuzzDecodeRef agent/intake:FuzzHandle; do
	pkg=${spec%%:*} target=${spec##*:}
	if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime 40000x "./$pkg" >"$WORK/fuzz-$target.log" 2>&1; then
		echo "fuzz $target failed:"; tail -20 "$WORK/fuzz-$target.log"; status=1
	else
		echo "fuzz $target: ok"
	fi
done

# What each failed test printed (its t.Log/t.Error lines), so a CI log shows
# why and not only which.
# The first ten only: one broken part (a dead containerd) fails every test after it.
for name in $(grep -oE '^\s*--- FAIL: [^ ]+' "$WORK/test.log" | awk '{print $3}' | awk '!seen[$0]++' | head -10); do
	echo "== why $name failed (its last lines):"
	awk -v n="$name" '$0 ~ "^=== (RUN|CONT|PAUSE)" {cur=$3} cur==n || cur ~ "^"n"/" {print}' "$WORK/test.log" |
		grep -E '^\s+[A-Za-z0-9_]+\.go:[0-9]+:|panic|--- FAIL' | tail -15 | cut -c1-400
done
passed=$(grep -cE '^\s*--- PASS' "$WORK/test.log" || true)
failed=$(grep -cE '^\s*--- FAIL' "$WORK/test.log" || true)
skipped=$(grep -cE '^\s*--- SKIP' "$WORK/test.log" || true)
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$status"
