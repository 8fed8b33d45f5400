#!/usr/bin/env bash
# Release checks, run by test/run-tests.sh (make test) or alone
# (make release-test), as root on Debian 12:
#   1. make release: static mqlet and mqletctl for amd64, arm64, armhf; SHA256SUMS.
#   2. The arm64 and armv7 binaries under qemu-user-static: --version,
#      --check-config, and a start against the embedded broker with no CRI
#      that publishes "online" within 60 s (emulated; the time is reported).
#   3. .deb packages for the three architectures (nfpm).
#   4. The amd64 .deb installed with dpkg -i on this machine: a pod applied
#      over MQTT runs on the containerd it configured, with an IP from the
#      installed CNI network and the pause image from the package.
#   5. Upgrade: version A runs 3 pods, the package of version B is installed
#      over it and mqlet restarted: the same containers keep running, and a
#      store made schema 1 is migrated (backup kept).
#   6. dpkg -r keeps pods and state; dpkg --purge stops every pod, then
#      removes the state.
# PID 1 is not systemd here, so the services are started by hand with the
# units' own command lines. Other containerds on this machine (/run/mqlet-*,
# /run/containerd) are never touched.
#
# Environment: MQLET_RELEASE_BRIDGE / MQLET_RELEASE_SUBNET (pod network of the
# installed package; default mqlrel0, 10.88.79.0/24).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export PATH=/usr/local/go/bin:$PATH
BRIDGE=${MQLET_RELEASE_BRIDGE:-mqlrel0}
SUBNET=${MQLET_RELEASE_SUBNET:-10.88.79.0/24}
WORK=$(mktemp -d /tmp/mqlet-release.XXXXXX)
SOCK=/run/mqlet/containerd/containerd.sock
NODE=relnode
PREFIX=mqlet/v1
pids=()
installed_by_us=

log() { echo "release: $*"; }
fail() { echo "release: FAIL: $*" >&2; exit 1; }

# mosquitto_sub -W does not always end the client here when nothing
# arrives; timeout -k makes sure it ends.
msub() { local t=$1; shift; timeout -k 1 "$t" mosquitto_sub -W "$t" "$@" 2>/dev/null; }

free_port() { # a loopback TCP port nobody listens on
	local p
	while :; do
		p=$(shuf -i 20000-60999 -n 1)
		[ -z "$(ss -Hltn "sport = :$p")" ] && { echo "$p"; return; }
	done
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
since() { local ms=$(($(now_ms) - $1)); printf '%d.%02d' $((ms / 1000)) $((ms % 1000 / 10)); } # seconds since a now_ms
ip4() { local IFS=.; set -- $1; echo $((($1 << 24) + ($2 << 16) + ($3 << 8) + $4)); }
in_subnet() { # in_subnet IP CIDR
	local net=${2%/*} bits=${2#*/}
	local mask=$(((0xffffffff << (32 - bits)) & 0xffffffff))
	[ $(($(ip4 "$1") & mask)) -eq $(($(ip4 "$net") & mask)) ]
}

stop_pid() { # stop_pid PID: SIGTERM, wait up to 20 s, then SIGKILL
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for i in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	set +e
	for pid in "${pids[@]}"; do stop_pid "$pid"; done
	if [ -n "$installed_by_us" ] && dpkg -s mqlet >/dev/null 2>&1; then
		log "cleanup: purging the mqlet package (stops its pods first)"
		dpkg --purge mqlet >"$WORK/cleanup-purge.log" 2>&1 || cat "$WORK/cleanup-purge.log"
	fi
	[ -n "${cni_existed-x}" ] || rmdir /etc/cni/net.d /etc/cni 2>/dev/null
	if [ $rc -ne 0 ]; then
		for f in "$WORK"/*.log; do [ -s "$f" ] && { echo "--- $f (tail)"; tail -25 "$f"; }; done
	fi
	if [ -n "${MQLET_RELEASE_KEEP:-}" ]; then echo "release: kept $WORK"; else rm -rf "$WORK"; fi
	exit $rc
}
trap cleanup EXIT INT TERM

# state_online FILE: the retained state message in FILE says online.
wait_online() { # wait_online BROKER_PORT NODE TIMEOUT [VERSION]: the retained state turns online (of VERSION)
	local deadline=$(($(date +%s) + $3)) state
	while [ "$(date +%s)" -lt $deadline ]; do
		state=$(msub 2 -p "$1" -t "$PREFIX/$2/state" -C 1 || true)
		if grep -q '"state":"online"' <<<"$state" && { [ -z "${4:-}" ] || grep -qF "\"version\":\"$4\"" <<<"$state"; }; then
			return 0
		fi
		sleep 0.2
	done
	return 1
}
pod_status() { # pod_status PORT NAME: the retained pod
	msub 5 -p "$1" -t "$PREFIX/$NODE/pods/default/$2" -C 1
}
pod_yaml() {
	cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
YAML
}

# ---------------------------------------------------------------- 1. builds
VERSION_A=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
log "make release ($VERSION_A)"
make -s release VERSION="$VERSION_A" >"$WORK/release.log" 2>&1 || fail "make release"
(cd dist && sha256sum -c --quiet SHA256SUMS) || fail "SHA256SUMS does not match"
for spec in "amd64:x86-64" "arm64:ARM aarch64" "armhf:ARM, EABI5"; do
	arch=${spec%%:*} want=${spec#*:}
	for b in mqlet mqletctl; do
		desc=$(file -b "dist/$b-linux-$arch")
		case $desc in *"$want"*"statically linked"*) ;; *) fail "dist/$b-linux-$arch: $desc" ;; esac
	done
	log "  $arch: mqlet $(stat -c %s dist/mqlet-linux-$arch) bytes, mqletctl $(stat -c %s dist/mqletctl-linux-$arch) bytes (stripped, static)"
done
go run ./test/size check dist/mqlet-linux-* dist/mqletctl-linux-* | sed 's/^/release: /' || fail "a release binary grew past test/size/sizes.txt"

# ---------------------------------------------------------------- 2. qemu
command -v qemu-aarch64-static >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null
for spec in arm64:qemu-aarch64-static armhf:qemu-arm-static; do
	arch=${spec%%:*} qemu=${spec#*:}
	bin="$REPO/dist/mqlet-linux-$arch"
	out=$("$qemu" "$bin" --version) || fail "$arch --version"
	[ "$out" = "mqlet $VERSION_A" ] || fail "$arch --version said $out"
	dir="$WORK/qemu-$arch"
	mkdir -p "$dir"
	port=$(free_port)
	"$qemu" "$bin" init --config "$dir/mqlet.yaml" --node "q$arch" --embedded-broker --state-dir "$dir/state" \
		--cri-endpoint "unix://$dir/no-cri.sock" >/dev/null || fail "$arch init"
	sed -i "s/127.0.0.1:1883/127.0.0.1:$port/g" "$dir/mqlet.yaml"
	"$qemu" "$bin" --check-config --require-broker --config "$dir/mqlet.yaml" >/dev/null || fail "$arch --check-config of a valid config"
	printf 'node: q\npods:\n  workers: 0\n' >"$dir/bad.yaml"
	rc=0; "$qemu" "$bin" --check-config --config "$dir/bad.yaml" 2>"$dir/bad.out" || rc=$?
	[ $rc -eq 2 ] && grep -q pods.workers "$dir/bad.out" || fail "$arch --check-config of an invalid config: exit $rc"
	"$qemu" "$bin" --config "$dir/mqlet.yaml" >"$WORK/qemu-$arch.log" 2>&1 &
	pid=$!; pids+=("$pid")
	start=$(now_ms)
	ok=
	# Emulation is slow, slower still on a loaded machine: the bound is
	# generous and the time it took is reported.
	while :; do
		if msub 1 -p "$port" -t "$PREFIX/q$arch/state" -C 1 | grep -q '"state":"online"'; then ok=1; break; fi
		kill -0 "$pid" 2>/dev/null || break
		[ $(($(now_ms) - start)) -gt 60000 ] && break
		sleep 0.2
	done
	[ -n "$ok" ] || fail "$arch under $qemu did not publish online within 60 s"
	online_after=$(since "$start")
	# It keeps running for 10 s more, then stops cleanly on SIGTERM and
	# says offline itself.
	online_at=$(now_ms)
	while [ $(($(now_ms) - online_at)) -lt 10000 ]; do
		kill -0 "$pid" 2>/dev/null || fail "$arch under $qemu exited within 10 s of being online"
		sleep 0.5
	done
	msub 2 -p "$port" -t "$PREFIX/q$arch/state" -C 1 | grep -q '"state":"online"' || fail "$arch not online 10 s later"
	stop_pid "$pid"
	wait "$pid" 2>/dev/null || fail "$arch exited non-zero after SIGTERM"
	grep -q '"message":"mqlet stopped"' "$WORK/qemu-$arch.log" || fail "$arch did not stop cleanly"
	log "  $arch under $qemu: online after $online_after s, still online 10 s later, clean stop on SIGTERM (embedded broker, no CRI)"
done

# ---------------------------------------------------------------- 3. packages
log "packages"
packaging/build-debs.sh "$VERSION_A" >"$WORK/debs.log" 2>&1 || fail "build-debs"
for arch in amd64 arm64 armhf; do
	deb=$(ls dist/mqlet_*_"$arch".deb)
	# grep reads the whole listing: grep -q would close the pipe early and fail dpkg-deb (pipefail).
	dpkg-deb -c "$deb" | grep ' ./usr/share/mqlet/pause.oci.tar$' >/dev/null || fail "$deb has no pause image"
	[ "$(dpkg-deb -f "$deb" Architecture)" = "$arch" ] || fail "$deb architecture"
	log "  $(basename "$deb"): $(stat -c %s "$deb") bytes"
done
DEB_A=$(ls "$REPO"/dist/mqlet_*_amd64.deb)

# ---------------------------------------------------------------- 4. install
if dpkg -s mqlet >/dev/null 2>&1; then fail "an mqlet package is already installed here; not touching it"; fi
for p in /etc/mqlet /var/lib/mqlet /run/mqlet /etc/cni/net.d/mqlet; do
	[ ! -e "$p" ] || fail "$p exists without the package: not touching it"
done
if ip link show "$BRIDGE" >/dev/null 2>&1; then fail "bridge $BRIDGE exists: set MQLET_RELEASE_BRIDGE"; fi
cni_existed=; [ -d /etc/cni/net.d ] && cni_existed=1
admin_conf=$(sha256sum /etc/containerd/config.toml 2>/dev/null || echo none)

log "dpkg -i $(basename "$DEB_A")"
installed_by_us=1
t0=$(now_ms)
MQLET_POD_SUBNET=$SUBNET MQLET_POD_BRIDGE=$BRIDGE dpkg -i "$DEB_A" >"$WORK/dpkg-i.log" 2>&1 || fail "dpkg -i"
log "  installed in $(since "$t0") s"
[ "$(mqlet --version)" = "mqlet $VERSION_A" ] || fail "installed mqlet --version"
[ "$(sha256sum /etc/containerd/config.toml 2>/dev/null || echo none)" = "$admin_conf" ] || fail "/etc/containerd/config.toml was changed"
grep -q "\"subnet\": \"$SUBNET\"" /etc/cni/net.d/mqlet/10-mqlet.conflist || fail "conflist lacks the subnet"
grep -q "\"bridge\": \"$BRIDGE\"" /etc/cni/net.d/mqlet/10-mqlet.conflist || fail "conflist lacks the bridge"
rc=0; mqlet --check-config --require-broker --config /etc/mqlet/mqlet.yaml >/dev/null 2>&1 || rc=$?
[ $rc -eq 3 ] || fail "a fresh install's config should name no broker (exit 3), got $rc"
# What a Debian user looks for: copyright, changelog, man pages, completion,
# the docs the README links to, and registry hosts.d without a hand edit.
for f in /usr/share/doc/mqlet/copyright /usr/share/doc/mqlet/changelog.gz /usr/share/man/man8/mqlet.8.gz \
	/usr/share/man/man1/mqletctl.1.gz /usr/share/bash-completion/completions/mqletctl /usr/share/zsh/vendor-completions/_mqletctl; do
	[ -s "$f" ] || fail "$f not installed"
done
grep -q '^License: Apache-2.0' /usr/share/doc/mqlet/copyright || fail "copyright names no license"
zcat /usr/share/doc/mqlet/changelog.gz | head -1 | grep -q "^mqlet (" || fail "changelog.gz is not a Debian changelog"
for doc in $(grep -o '(docs/[a-z-]*\.md' "$REPO/README.md" | tr -d '(' | sort -u); do
	[ -s "/usr/share/doc/mqlet/$doc" ] || fail "README links $doc, not installed"
done
zcat /usr/share/man/man1/mqletctl.1.gz | grep -q '^\.SS rollout' || fail "mqletctl.1 lacks a command"
if command -v man >/dev/null; then
	man -l /usr/share/man/man1/mqletctl.1.gz 2>&1 | grep -q 'MQLETCTL(1)' || fail "mqletctl.1 does not render"
fi
grep -q 'complete .*mqletctl' /usr/share/bash-completion/completions/mqletctl || fail "bash completion registers nothing"
grep -q 'config_path = "/etc/mqlet/certs.d"' /etc/mqlet/containerd.toml || fail "the shipped containerd config has no hosts.d config_path"
log "  copyright, changelog, man pages (mqlet.8, mqletctl.1), bash and zsh completion, docs, hosts.d in /etc/mqlet/certs.d: installed"
if command -v systemd-analyze >/dev/null; then
	systemd-analyze verify /lib/systemd/system/mqlet.service /lib/systemd/system/mqlet-containerd.service >"$WORK/verify.log" 2>&1 || fail "systemd-analyze verify: $(cat "$WORK/verify.log")"
	log "  systemd-analyze verify: both units clean"
fi

# mqlet-containerd.service by hand: ExecStart, then ExecStartPost.
start_containerd() {
	containerd --config /etc/mqlet/containerd.toml >>"$WORK/containerd.log" 2>&1 &
	cpid=$!; pids+=("$cpid")
	for i in $(seq 1 100); do ctr -a $SOCK --timeout 1s version >/dev/null 2>&1 && return 0; sleep 0.1; done
	fail "mqlet's containerd did not answer on $SOCK"
}
start_containerd
/usr/lib/mqlet/import-pause >"$WORK/import.log" 2>&1 || fail "import-pause"
pause_pkg=$(tar -xOf /usr/share/mqlet/pause.oci.tar index.json | jq -r '.manifests[0].digest')
pause_ctr=$(ctr -a $SOCK -n k8s.io images ls | awk '$1=="localhost/mqlet/pause:1"{print $3}')
[ "$pause_pkg" = "$pause_ctr" ] || fail "pause image in containerd ($pause_ctr) is not the package's ($pause_pkg)"
# The workload image (the pause image is the package's; this is the test's pod).
MQLET_IMAGES=all test/images/build.sh "$WORK/images" >/dev/null
ctr -a $SOCK -n k8s.io images import "$WORK/images/busybox.tar" >/dev/null

BPORT=$(free_port)
mosquitto -p "$BPORT" >"$WORK/mosquitto.log" 2>&1 &
pids+=("$!")
for i in $(seq 1 50); do mosquitto_pub -p "$BPORT" -t mqlet-release/ready -m 1 2>/dev/null && break; sleep 0.1; done
mqlet init --node "$NODE" --broker "tcp://127.0.0.1:$BPORT" >/dev/null || fail "mqlet init"
mqlet --check-config --require-broker --config /etc/mqlet/mqlet.yaml >/dev/null || fail "check-config after init"

# mqlet.service by hand: ExecCondition, then ExecStart.
start_mqlet() { # start_mqlet LOG VERSION
	mqlet --check-config --require-broker --config /etc/mqlet/mqlet.yaml >/dev/null || fail "ExecCondition"
	/usr/bin/mqlet --config /etc/mqlet/mqlet.yaml >"$1" 2>&1 &
	mpid=$!; pids+=("$mpid")
	wait_online "$BPORT" "$NODE" 20 "$2" || fail "installed mqlet $2 did not come online"
}
start_mqlet "$WORK/mqlet-A.log" "$VERSION_A"
# Idle: online for 5 s, no pods.
sleep 5
rss=$(awk '/VmRSS/{print $2}' /proc/$mpid/status)
log "  mqlet idle RSS (no pods): $((rss / 1024)) MiB ($rss kB, VmRSS of /proc/$mpid/status)"
for i in 1 2 3; do
	# mqletctl publishes the apply and waits for the agent's verdict (succeeded = running).
	pod_yaml "web$i" | timeout -k 1 120 mqletctl --broker "tcp://127.0.0.1:$BPORT" --node "$NODE" apply -f - >>"$WORK/apply.log" 2>&1 || fail "pod web$i did not run"
done
status=$(pod_status "$BPORT" web1)
ip=$(jq -r '.status.podIP' <<<"$status")
in_subnet "$ip" "$SUBNET" || fail "pod IP $ip is not in $SUBNET"
sandbox_images=$(ctr -a $SOCK -n k8s.io containers ls | awk 'NR>1{print $2}' | sort | uniq -c)
grep -q 'localhost/mqlet/pause:1' <<<"$sandbox_images" || fail "sandboxes do not use the packaged pause image: $sandbox_images"
log "  pod web1 running with IP $ip from $SUBNET on bridge $BRIDGE; sandboxes on localhost/mqlet/pause:1"
rss=$(awk '/VmRSS/{print $2}' /proc/$mpid/status)
log "  mqlet RSS with 3 pods: $((rss / 1024)) MiB ($rss kB)"

# ---------------------------------------------------------------- 5. upgrade
ids() { # container id, restart count and state of each pod, sorted
	for i in 1 2 3; do
		pod_status "$BPORT" "web$i" | jq -r '[.metadata.name, .status.containerStatuses[0].containerID, .status.containerStatuses[0].restartCount, (.status.containerStatuses[0].state | keys[0])] | join(" ")'
	done
}
before=$(ids)
tasks_before=$(ctr -a $SOCK -n k8s.io tasks ls | awk 'NR>1{print $1, $2, $3}' | sort)
grep -c RUNNING <<<"$tasks_before" | grep -qx 6 || fail "expected 3 sandboxes + 3 containers running: $tasks_before"
go build -o "$WORK/oldstore" ./test/release/oldstore
SCHEMA=$("$WORK/oldstore" -current)
log "upgrade: stopping A (systemctl stop: SIGTERM to mqlet only), making its store schema 1"
stop_pid "$mpid"
"$WORK/oldstore" /var/lib/mqlet/state.db || fail "making the store schema 1"
[ "$("$WORK/oldstore" -print /var/lib/mqlet/state.db)" = none ] || fail "store still has a schema version"
VERSION_B="$VERSION_A-upgrade"
mkdir -p "$WORK/distB"
for b in mqlet mqletctl; do
	CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags "-s -w -X github.com/mqlet/mqlet/internal/version.Version=$VERSION_B" -o "$WORK/distB/$b-linux-amd64" "./cmd/$b"
done
DEB_VERSION="$(dpkg-deb -f "$DEB_A" Version)+b" DIST="$WORK/distB" packaging/build-debs.sh "$VERSION_B" amd64 >"$WORK/debs-B.log" 2>&1 || fail "building package B"
DEB_B=$(ls "$WORK"/distB/mqlet_*_amd64.deb)
t0=$(now_ms)
dpkg -i "$DEB_B" >"$WORK/dpkg-upgrade.log" 2>&1 || fail "dpkg -i of B over A"
log "  $(basename "$DEB_B") installed over A in $(since "$t0") s"
[ "$(mqlet --version)" = "mqlet $VERSION_B" ] || fail "upgraded mqlet --version"
grep -q "node: $NODE" /etc/mqlet/mqlet.yaml || fail "the upgrade replaced the configured /etc/mqlet/mqlet.yaml"
start_mqlet "$WORK/mqlet-B.log" "$VERSION_B"
grep -q '"message":"state store migrated to a new schema' "$WORK/mqlet-B.log" || fail "B did not report a schema migration"
grep '"message":"state store migrated' "$WORK/mqlet-B.log" | grep -q '"from":1' || fail "B migrated from another schema than 1"
[ -f /var/lib/mqlet/state.db.schema-1.bak ] || fail "no backup of the schema-1 store"
[ "$("$WORK/oldstore" -print /var/lib/mqlet/state.db.schema-1.bak)" = none ] || fail "the backup is not the old store"
# B has reconciled once it republished each pod; give it the time to (wrongly) restart anything.
msub 10 -p "$BPORT" -t "$PREFIX/$NODE/events" >"$WORK/events-B.log" || true
after=$(ids)
tasks_after=$(ctr -a $SOCK -n k8s.io tasks ls | awk 'NR>1{print $1, $2, $3}' | sort)
[ "$before" = "$after" ] || fail "pods changed across the upgrade:\nbefore:\n$before\nafter:\n$after"
[ "$tasks_before" = "$tasks_after" ] || fail "containerd tasks changed across the upgrade:\n$tasks_before\n--\n$tasks_after"
grep -q '"reason":"\(Killing\|Created\|Started\)"' "$WORK/events-B.log" && fail "B killed, created or started a container: $(cat "$WORK/events-B.log")"
log "  same 3 containers running (ids, pids, restartCount 0), store migrated 1 -> $SCHEMA with backup state.db.schema-1.bak"
while read -r name id restarts state; do
	[ "$restarts" = 0 ] && [ "$state" = running ] || fail "$name: restarts $restarts state $state"
done <<<"$after"

# ---------------------------------------------------------------- 6. remove, purge
log "dpkg -r (services stopped by hand first, as prerm's systemctl stop would)"
stop_pid "$mpid"
stop_pid "$cpid"
[ "$("$WORK/oldstore" -print /var/lib/mqlet/state.db)" = "$SCHEMA" ] || fail "store not at schema $SCHEMA after B"
# A store from a newer mqlet is refused, clearly, and left as it was.
mkdir -p "$WORK/future"
cp /var/lib/mqlet/state.db "$WORK/future/state.db"
"$WORK/oldstore" -set 99 "$WORK/future/state.db"
sum=$(sha256sum <"$WORK/future/state.db")
rc=0; mqlet --state-dir "$WORK/future" --node future --broker tcp://127.0.0.1:1 --cri-endpoint "unix://$WORK/future/none.sock" >"$WORK/future.log" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q 'written by a newer mqlet: schema version 99' "$WORK/future.log" || fail "a schema-99 store was not refused clearly (exit $rc): $(tail -2 "$WORK/future.log")"
[ "$(sha256sum <"$WORK/future/state.db")" = "$sum" ] || fail "the refused newer store was changed"
log "  a store of schema 99 is refused (exit 1, \"written by a newer mqlet\") and left unchanged"
task_pids=$(awk '{print $2}' <<<"$tasks_after")
dpkg -r mqlet >"$WORK/dpkg-r.log" 2>&1 || fail "dpkg -r"
for p in $task_pids; do kill -0 "$p" 2>/dev/null || fail "dpkg -r stopped pod process $p"; done
[ -f /var/lib/mqlet/state.db ] || fail "dpkg -r removed the state"
[ ! -e /usr/bin/mqlet ] || fail "dpkg -r left /usr/bin/mqlet"
log "  pods still running, state kept"
# The pods' log directories (the host's /var/log/pods, the package's podLogDir).
mapfile -t pod_logs < <(ls -d /var/log/pods/default_web[0-9]_* 2>/dev/null)
[ ${#pod_logs[@]} -ge 3 ] || fail "the 3 pods' log directories are not under /var/log/pods: ${pod_logs[*]}"
dpkg --purge mqlet >"$WORK/dpkg-purge.log" 2>&1 || fail "dpkg --purge"
installed_by_us=
grep -q '3 pods stopped and removed' "$WORK/dpkg-purge.log" || fail "purge did not stop the 3 pods: $(cat "$WORK/dpkg-purge.log")"
for p in $task_pids; do
	for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	kill -0 "$p" 2>/dev/null && fail "pod process $p survived the purge"
done
for p in /var/lib/mqlet /etc/mqlet /run/mqlet /etc/cni/net.d/mqlet; do [ ! -e "$p" ] || fail "purge left $p"; done
ip link show "$BRIDGE" >/dev/null 2>&1 && fail "purge left bridge $BRIDGE"
grep -q ' /var/lib/mqlet' /proc/mounts && fail "purge left mounts under /var/lib/mqlet"
ps -eo args | grep -F -- "-address $SOCK" | grep -v grep && fail "purge left shims of mqlet's containerd"
for d in "${pod_logs[@]}"; do [ ! -e "$d" ] || fail "purge left the pod log directory $d"; done
log "  purge stopped the pods, then removed state, config, network, bridge and the pods' ${#pod_logs[@]} log directories"
log "ok"
