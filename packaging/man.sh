#!/usr/bin/env bash
# Writes the man pages mqlet.1 and mqletctl.1 from the binaries' own help,
# so the pages say what the binaries do.
#   packaging/man.sh MQLET MQLETCTL VERSION OUTDIR
# MQLET and MQLETCTL are binaries that run on this host.
set -euo pipefail
MQLET=${1:?usage: man.sh MQLET MQLETCTL VERSION OUTDIR}
CTL=${2:?} VERSION=${3:?} OUT=${4:?}
mkdir -p "$OUT"
DATE=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%d)

# roff-safe text: backslashes escaped, a line starting with . or ' kept literal.
esc() { sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/"; }

{
	echo ".TH MQLET 8 \"$DATE\" \"mqlet $VERSION\" \"System Administration\""
	echo ".SH NAME"
	echo "mqlet \\- a small kubelet for edge gateways that takes its orders over MQTT"
	echo ".SH SYNOPSIS"
	echo ".B mqlet"
	echo "[\\fIflags\\fR]"
	echo ".br"
	echo ".B mqlet init"
	echo "\\-\\-node \\fINAME\\fR [\\-\\-broker \\fIURL\\fR | \\-\\-embedded\\-broker]"
	echo ".SH DESCRIPTION"
	echo "mqlet runs Kubernetes Pods through the container runtime's CRI on commands"
	echo "received over MQTT, and publishes node state, pod status, events and metrics."
	echo "Settings come from defaults, then the YAML file named by \\-\\-config"
	echo "(/etc/mqlet/mqlet.yaml in the package; every default in"
	echo "/usr/share/doc/mqlet/mqlet.yaml), then MQLET_* environment variables, then flags."
	echo ".SH OPTIONS"
	echo ".nf"
	"$MQLET" --help 2>&1 | esc
	echo ".fi"
	echo ".SH FILES"
	echo "/etc/mqlet/mqlet.yaml, /etc/mqlet/containerd.toml, /var/lib/mqlet (state)"
	echo ".SH SEE ALSO"
	echo "mqletctl(1); /usr/share/doc/mqlet/"
} | gzip -9n >"$OUT/mqlet.8.gz"

{
	echo ".TH MQLETCTL 1 \"$DATE\" \"mqlet $VERSION\" \"User Commands\""
	echo ".SH NAME"
	echo "mqletctl \\- command mqlet edge gateways over MQTT, like kubectl"
	echo ".SH SYNOPSIS"
	echo ".B mqletctl"
	echo "[\\fIglobal flags\\fR] \\fICOMMAND\\fR [\\fIflags\\fR] [\\fIargs\\fR]"
	echo ".SH DESCRIPTION"
	echo ".nf"
	"$CTL" help 2>&1 | esc
	echo ".fi"
	echo ".SH COMMANDS"
	for cmd in $("$CTL" help 2>&1 | awk '/^Commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {exit}'); do
		echo ".SS $cmd"
		echo ".nf"
		"$CTL" help "$cmd" 2>&1 | esc
		echo ".fi"
	done
	echo ".SH SEE ALSO"
	echo "mqlet(8); /usr/share/doc/mqlet/"
} | gzip -9n >"$OUT/mqletctl.1.gz"
