#!/usr/bin/env bash
# Proves the README's quick start on a machine that has nothing installed: a fresh Debian 12 root
# file system (debootstrap --variant=minbase bookworm, from Debian's own packages), a clone of this
# repository's committed HEAD inside it, then the README's two quick-start commands run in a
# chroot of that root, read from README.md itself, and nothing else. Exits with the status of the
# first command that fails. Needs root, debootstrap and a Debian mirror; takes a few minutes
# (debootstrap, package installs, build, the test suite). Not part of the ctest run.
#
#   bash scripts/fresh-machine-check.sh [WORKDIR]
#
# WORKDIR (default: a new directory under /tmp) receives the root file system and is removed at
# the end unless SIMDATTN_FRESH_KEEP=1. SIMDATTN_FRESH_MIRROR picks the mirror (default
# http://deb.debian.org/debian). SIMDATTN_FRESH_BASE=FILE.tar reuses a bootstrapped root saved
# there by an earlier run (written when the file does not exist yet), to repeat the check quickly.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MIRROR="${SIMDATTN_FRESH_MIRROR:-http://deb.debian.org/debian}"
BASE="${SIMDATTN_FRESH_BASE:-}"

die() { echo "fresh-machine-check: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || die "needs debootstrap: apt-get install debootstrap"

# The README's quick start: the indented lines of the first code block under '## Quick start'.
mapfile -t QUICK < <(awk '/^## Quick start/{on=1; next} on && /^## /{exit}
                          on && /^    [^ ]/{sub(/^    /, ""); print; seen=1; next}
                          on && seen && /^$/{exit}' "$REPO/README.md")
((${#QUICK[@]} == 2)) || die "README.md's quick start should hold two commands, found ${#QUICK[@]}"

if [[ -n $(git -C "$REPO" status --porcelain --untracked-files=no) ]]; then
  echo "fresh-machine-check: note: uncommitted changes are not part of the check (it clones HEAD)"
fi

WORK="${1:-$(mktemp -d /tmp/simdattn-fresh.XXXXXX)}"
mkdir -p "$WORK"
ROOTFS="$WORK/root"
[[ ! -e $ROOTFS ]] || die "$ROOTFS exists: give an empty WORKDIR"

cleanup() {
  local rc=$?
  for m in dev/pts dev sys proc; do
    mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m"
  done
  if [[ ${SIMDATTN_FRESH_KEEP:-0} != 1 ]]; then rm -rf --one-file-system "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT

start=$SECONDS
stage() { printf '=== [%4ds] %s\n' $((SECONDS - start)) "$*"; }

if [[ -n $BASE && -f $BASE ]]; then
  stage "fresh root: unpacking $BASE"
  mkdir -p "$ROOTFS" && tar -xpf "$BASE" -C "$ROOTFS"
else
  stage "fresh root: debootstrap --variant=minbase bookworm $MIRROR"
  debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -20 "$WORK/debootstrap.log"; die "debootstrap failed"; }
  if [[ -n $BASE ]]; then tar -cpf "$BASE" -C "$ROOTFS" .; fi
fi

stage "clone $(git -C "$REPO" rev-parse --short HEAD) into /root/simdattn"
git clone --quiet --no-hardlinks "$REPO" "$ROOTFS/root/simdattn"

cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount -t proc proc "$ROOTFS/proc"
mount -t sysfs sys "$ROOTFS/sys"
mount --bind /dev "$ROOTFS/dev"
mount --bind /dev/pts "$ROOTFS/dev/pts"

for cmd in "${QUICK[@]}"; do
  stage "in the fresh root: $cmd"
  chroot "$ROOTFS" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/simdattn && $cmd"
done
stage "passed: the README's two quick-start commands on a fresh Debian 12 root"
