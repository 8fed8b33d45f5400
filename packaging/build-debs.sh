#!/usr/bin/env bash
# Builds dist/mqlet_<version>_<arch>.deb for amd64, arm64 and armhf from the
# binaries of `make release`, with nfpm from packaging/tools (Go proxy only).
#   packaging/build-debs.sh VERSION [ARCH...]
# VERSION is the binaries' version (git describe); the Debian version is
# derived from it unless DEB_VERSION is set.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
VERSION=${1:?usage: build-debs.sh VERSION [ARCH...]}
shift
ARCHES=("$@")
[ ${#ARCHES[@]} -gt 0 ] || ARCHES=(amd64 arm64 armhf)
if [ -z "${DEB_VERSION:-}" ]; then
	# A tag (v1.2.3, 1.2.3-4-gabc) is the version; a bare commit hash gets a
	# commit-date prefix so that later builds sort higher.
	if [[ $VERSION =~ ^v?[0-9]+\.[0-9]+ ]]; then
		DEB_VERSION=${VERSION#v}
	else
		DEB_VERSION="0~git$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S).$VERSION"
	fi
fi
DEB_VERSION=${DEB_VERSION//-/.} # no Debian revision part
DIST=${DIST:-dist} # where the binaries are and the packages go
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
NFPM="$WORK/nfpm"
(cd packaging/tools && go build -o "$NFPM" github.com/goreleaser/nfpm/v2/cmd/nfpm)

# What every architecture ships alike, made with binaries of this host:
# man pages and shell completion from the binaries' own help, the Debian
# changelog and the docs the README links to.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
go build -tags grpcnotrace -o "$WORK/host/mqlet" ./cmd/mqlet
go build -o "$WORK/host/mqletctl" ./cmd/mqletctl
packaging/man.sh "$WORK/host/mqlet" "$WORK/host/mqletctl" "$VERSION" "$WORK/man"
"$WORK/host/mqletctl" completion bash >"$WORK/mqletctl.bash"
"$WORK/host/mqletctl" completion zsh >"$WORK/_mqletctl"
{
	echo "mqlet ($DEB_VERSION) unstable; urgency=medium"
	echo
	echo "  * Built from mqlet $VERSION."
	echo
	echo " -- mqlet maintainers <mqlet@localhost>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$WORK/changelog.gz"
docs=""
for f in docs/*.md; do
	docs+="  - {src: $f, dst: /usr/share/doc/mqlet/$f, file_info: {mode: 0644}}"$'\n'
done

for deb in "${ARCHES[@]}"; do
	case $deb in
	amd64) goarch=amd64 goarm= ;;
	arm64) goarch=arm64 goarm= ;;
	armhf) goarch=arm goarm=7 ;;
	*) echo "unknown architecture $deb" >&2; exit 1 ;;
	esac
	for b in mqlet mqletctl; do
		[ -x "$DIST/$b-linux-$deb" ] || { echo "$DIST/$b-linux-$deb missing: run make release" >&2; exit 1; }
	done
	mkdir -p "$WORK/$deb"
	GOARCH=$goarch GOARM=$goarm MQLET_IMAGES=pause MQLET_PAUSE_IMAGE=localhost/mqlet/pause:1 \
		test/images/build.sh "$WORK/$deb" >/dev/null
	cat >"$WORK/$deb/nfpm.yaml" <<YAML
name: mqlet
arch: $deb
platform: linux
version: "$DEB_VERSION"
version_schema: none
section: admin
priority: optional
maintainer: mqlet maintainers <mqlet@localhost>
description: |
  Small kubelet for edge gateways commanded over MQTT.
  Runs Kubernetes Pods through containerd's CRI on orders received over MQTT
  and publishes node state, pod status, events and metrics back. Ships its
  own containerd configuration, a CNI bridge network and the pause image.
homepage: https://github.com/mqlet/mqlet
license: Apache-2.0
depends:
  - containerd
  - runc
  - containernetworking-plugins
  - iptables
contents:
  - {src: $DIST/mqlet-linux-$deb, dst: /usr/bin/mqlet, file_info: {mode: 0755}}
  - {src: $DIST/mqletctl-linux-$deb, dst: /usr/bin/mqletctl, file_info: {mode: 0755}}
  - {src: packaging/files/mqlet.yaml, dst: /etc/mqlet/mqlet.yaml, type: config|noreplace, file_info: {mode: 0600}}
  - {src: deploy/containerd-config.toml, dst: /etc/mqlet/containerd.toml, type: config|noreplace, file_info: {mode: 0644}}
  - {src: deploy/mqlet.service, dst: /lib/systemd/system/mqlet.service, file_info: {mode: 0644}}
  - {src: deploy/mqlet-containerd.service, dst: /lib/systemd/system/mqlet-containerd.service, file_info: {mode: 0644}}
  - {src: packaging/files/import-pause, dst: /usr/lib/mqlet/import-pause, file_info: {mode: 0755}}
  - {src: $WORK/$deb/pause.tar, dst: /usr/share/mqlet/pause.oci.tar, file_info: {mode: 0644}}
  - {src: packaging/files/10-mqlet.conflist.in, dst: /usr/share/mqlet/10-mqlet.conflist.in, file_info: {mode: 0644}}
  - {src: README.md, dst: /usr/share/doc/mqlet/README.md, file_info: {mode: 0644}}
  - {src: packaging/files/copyright, dst: /usr/share/doc/mqlet/copyright, file_info: {mode: 0644}}
  - {src: $WORK/changelog.gz, dst: /usr/share/doc/mqlet/changelog.gz, file_info: {mode: 0644}}
  - {src: $WORK/man/mqlet.8.gz, dst: /usr/share/man/man8/mqlet.8.gz, file_info: {mode: 0644}}
  - {src: $WORK/man/mqletctl.1.gz, dst: /usr/share/man/man1/mqletctl.1.gz, file_info: {mode: 0644}}
  - {src: $WORK/mqletctl.bash, dst: /usr/share/bash-completion/completions/mqletctl, file_info: {mode: 0644}}
  - {src: $WORK/_mqletctl, dst: /usr/share/zsh/vendor-completions/_mqletctl, file_info: {mode: 0644}}
$docs
  - {src: configs/mqlet.yaml, dst: /usr/share/doc/mqlet/mqlet.yaml, file_info: {mode: 0644}}
  - {src: deploy/mosquitto-tls.conf, dst: /usr/share/doc/mqlet/mosquitto-tls.conf, file_info: {mode: 0644}}
  - {src: deploy/mosquitto-mqlet.acl, dst: /usr/share/doc/mqlet/mosquitto-mqlet.acl, file_info: {mode: 0644}}
scripts:
  postinstall: packaging/scripts/postinst
  preremove: packaging/scripts/prerm
  postremove: packaging/scripts/postrm
YAML
	"$NFPM" package --config "$WORK/$deb/nfpm.yaml" --packager deb --target "$DIST/mqlet_${DEB_VERSION}_${deb}.deb" >/dev/null
	echo "$DIST/mqlet_${DEB_VERSION}_${deb}.deb $(stat -c %s "$DIST/mqlet_${DEB_VERSION}_${deb}.deb") bytes"
done
(cd "$DIST" && sha256sum mqlet* >SHA256SUMS)
