#!/bin/sh
# install-deps.sh: installs the Debian packages libfsdp builds and tests with. Installs only
# what is missing (so it is quick and quiet when all is there); needs root or sudo to install.
#
#   scripts/install-deps.sh             (no arguments)
#   scripts/install-deps.sh -h | --help (prints this help, installs nothing)
#
# Prints nothing when every package is there; else the missing ones, then apt-get's output
# (apt-get update, then apt-get install of those alone).
# Exit status: 0 all there or installed; 1 packages missing and neither root nor sudo (the
# command to run is printed); 2 bad command line (nothing installed); otherwise apt-get's.
set -eu
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
case ${1:-} in
"") ;;
-h | --help) usage && exit 0 ;;
*)
    echo "install-deps: unexpected argument '$1' (it takes none)" >&2
    usage >&2
    exit 2
    ;;
esac

PACKAGES="build-essential cmake pkg-config libopenblas-dev libhdf5-dev hdf5-tools libzstd-dev \
libcunit1-dev libinih-dev libjansson-dev libopenmpi-dev openmpi-bin"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "libfsdp: installing missing Debian packages:$missing"
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "libfsdp: these packages are missing and this is not root (and sudo is absent):$missing" >&2
    echo "libfsdp: install them as root: apt-get install$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
