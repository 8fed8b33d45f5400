#!/usr/bin/env bash
# Installs mqlet on this Debian machine from a checkout, as root, the same
# way a gateway gets it: builds the package for this architecture and
# installs it with apt (which pulls containerd, runc and the CNI plugins).
# Prefer the released .deb on real gateways (README: "Install on a gateway").
set -euo pipefail
cd "$(dirname "$0")/.."
arch=$(dpkg --print-architecture)
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
make -s release VERSION="$version"
packaging/build-debs.sh "$version" "$arch"
apt-get install -y "./$(ls dist/mqlet_*_"$arch".deb | head -1)"
echo "installed; now: mqlet init --node NAME --broker URL [--ca F --cert F --key F] && systemctl restart mqlet"
