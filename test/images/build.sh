#!/usr/bin/env bash
# Builds OCI image archives without any registry:
#   OUTDIR/busybox.tar     -> docker.io/mqlet/busybox:test
#   OUTDIR/pause.tar       -> docker.io/mqlet/pause:test
#   OUTDIR/grpchealth.tar  -> docker.io/mqlet/grpchealth:test (a gRPC health server, for probe tests)
# Import them with: ctr -n k8s.io -a SOCKET images import OUTDIR/<name>.tar
set -euo pipefail

OUTDIR=${1:?usage: build.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUSYBOX_IMAGE=${MQLET_BUSYBOX_IMAGE:-docker.io/mqlet/busybox:test}
PAUSE_IMAGE=${MQLET_PAUSE_IMAGE:-docker.io/mqlet/pause:test}
GRPCHEALTH_IMAGE=${MQLET_GRPCHEALTH_IMAGE:-docker.io/mqlet/grpchealth:test}

for tool in tar gzip sha256sum jq; do
	command -v "$tool" >/dev/null || { echo "build.sh: $tool is required" >&2; exit 1; }
done
BUSYBOX_BIN=$(command -v busybox || true)
[ -x /bin/busybox ] && BUSYBOX_BIN=/bin/busybox
[ -n "$BUSYBOX_BIN" ] || [ "${MQLET_IMAGES:-all}" = pause ] || { echo "build.sh: busybox-static is required (apt-get install -y busybox-static)" >&2; exit 1; }
GO=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$GO" ] || { echo "build.sh: go is required to build the pause image" >&2; exit 1; }

ARCH=$("$GO" env GOARCH)
mkdir -p "$OUTDIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# oci_image NAME ROOTFS CONFIG_JSON OUT.tar: writes an OCI layout holding one
# layer made from ROOTFS and tars it.
oci_image() {
	local name=$1 rootfs=$2 imgconfig=$3 out=$4
	local layout="$WORK/layout-$(basename "$out" .tar)"
	rm -rf "$layout"
	mkdir -p "$layout/blobs/sha256"

	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2024-01-01 00:00Z' \
		-C "$rootfs" -cf "$WORK/layer.tar" .
	local diff_id
	diff_id=$(sha "$WORK/layer.tar")
	gzip -n -9 -c "$WORK/layer.tar" >"$WORK/layer.tar.gz"
	local layer_digest layer_size
	layer_digest=$(sha "$WORK/layer.tar.gz")
	layer_size=$(size "$WORK/layer.tar.gz")
	mv "$WORK/layer.tar.gz" "$layout/blobs/sha256/$layer_digest"
	rm -f "$WORK/layer.tar"

	jq -c --arg arch "$ARCH" --arg diff "sha256:$diff_id" \
		'{architecture: $arch, os: "linux", config: ., rootfs: {type: "layers", diff_ids: [$diff]}}' \
		<<<"$imgconfig" >"$WORK/config.json"
	local config_digest config_size
	config_digest=$(sha "$WORK/config.json")
	config_size=$(size "$WORK/config.json")
	mv "$WORK/config.json" "$layout/blobs/sha256/$config_digest"

	jq -nc --arg cd "sha256:$config_digest" --argjson cs "$config_size" \
		--arg ld "sha256:$layer_digest" --argjson ls "$layer_size" \
		'{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
		  config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
		  layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls}]}' \
		>"$WORK/manifest.json"
	local manifest_digest manifest_size
	manifest_digest=$(sha "$WORK/manifest.json")
	manifest_size=$(size "$WORK/manifest.json")
	mv "$WORK/manifest.json" "$layout/blobs/sha256/$manifest_digest"

	jq -nc --arg md "sha256:$manifest_digest" --argjson ms "$manifest_size" --arg name "$name" \
		--arg arch "$ARCH" \
		'{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
		  digest: $md, size: $ms, platform: {architecture: $arch, os: "linux"},
		  annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": ($name | split(":") | last)}}]}' \
		>"$layout/index.json"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"

	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2024-01-01 00:00Z' \
		-C "$layout" -cf "$out.tmp" oci-layout index.json blobs
	mv "$out.tmp" "$out"
	echo "built $out ($name)"
}

# busybox: the static binary, one symlink per applet, minimal /etc.
# MQLET_IMAGES=pause builds the pause image only (the package ships it, for
# any GOARCH; busybox-static is then not needed).
if [ "${MQLET_IMAGES:-all}" != pause ]; then
BB="$WORK/busybox-root"
mkdir -p "$BB/bin" "$BB/etc" "$BB/tmp" "$BB/root" "$BB/proc" "$BB/sys" "$BB/dev"
chmod 1777 "$BB/tmp"
cp "$BUSYBOX_BIN" "$BB/bin/busybox"
for applet in $("$BB/bin/busybox" --list); do
	[ "$applet" = busybox ] || ln -sf busybox "$BB/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$BB/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$BB/etc/group"
oci_image "$BUSYBOX_IMAGE" "$BB" \
	'{"Env":["PATH=/bin"],"Cmd":["sh"],"WorkingDir":"/"}' "$OUTDIR/busybox.tar"

# grpchealth: a static Go gRPC health server (test/images/grpchealth).
GR="$WORK/grpchealth-root"
mkdir -p "$GR"
(cd "$REPO" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$GR/grpchealth" ./test/images/grpchealth)
oci_image "$GRPCHEALTH_IMAGE" "$GR" '{"Entrypoint":["/grpchealth"],"User":"65534:65534"}' "$OUTDIR/grpchealth.tar"
fi

# pause: a tiny static Go binary.
PR="$WORK/pause-root"
mkdir -p "$PR"
(cd "$REPO" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$PR/pause" ./test/images/pause)
oci_image "$PAUSE_IMAGE" "$PR" '{"Entrypoint":["/pause"],"User":"0:0"}' "$OUTDIR/pause.tar"
