#!/usr/bin/env bash
# Build and test pyattn on aarch64 (Debian bookworm arm64) under qemu user-mode
# emulation, as root:  bash .ci/arm64.sh   (from anywhere in the clone)
#   1. host tools: qemu-user-static, debootstrap, binfmt-support; the kernel's
#      binfmt_misc handler for aarch64 binaries;
#   2. an arm64 Debian root in $ARM_ROOT, cached: reused while its marker
#      file lists the same packages, rebuilt after an interrupted creation;
#   3. the working tree's source (tracked + untracked, not ignored) copied in,
#      the extension built in place there with Debian's gcc and NumPy 1.24
#      headers (setup.py directly, not the pyproject's numpy>=2 build; the
#      pyproject's setuptools>=77 from wheels);
#   4. the tests once per kernel family the build has (PYATTN_ISA; pyattn._C.families()),
#      after show_config(): $TESTS on every family, $TESTS_SIMD on neon only, and a
#      generated subset of the `frame` tests on each.
set -euo pipefail
cd "$(dirname "$0")/.."
# chroot, update-binfmts, debootstrap live in sbin, which a CI shell's PATH may lack
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# every family: the kernels against their portable twins (tests/test_kernels.py
# builds the test-only extension of the checks in the root: tests/kcheck.py, with
# the root's gcc and setuptools), the recorded bits,
# the exp, the reference and the errors; the frame paths (which the x86 families
# already ran on the same portable C) on the SIMD family only (neon), which
# keeps this stage inside CI's time budget
TESTS="tests/test_reference.py tests/test_seeds.py tests/test_errors.py tests/test_isa.py tests/test_kernels.py tests/test_exp.py tests/test_ukr.py"
TESTS_SIMD="tests/test_generate.py tests/test_storage16.py tests/test_backward.py tests/test_bf16.py tests/test_quant.py tests/test_backward_split.py tests/test_rotary.py tests/test_flash_blocks.py"
# the frame paths and entry-point grids (marker `frame`, tests/conftest.py: varlen,
# paged, packed, block masks, the stride and property grids), selected by marker so
# a new one runs here too: a generated sixteenth of each test function's cases on
# neon, one case of each function on generic (--subset)
FRAME_FILES=$(grep -l "pytest.mark.frame" tests/test_*.py | tr '\n' ' ')
FRAME_SUBSET_SIMD=16
FRAME_SUBSET_GENERIC=1000
PACKAGES="python3,python3-numpy,python3-pytest,python3-dev,python3-setuptools,gcc,libc6-dev"
SUITE=bookworm
ARM_ROOT=${PYATTN_ARM64_ROOT:-/var/cache/pyattn/arm64-$SUITE}
SRC=/pyattn-src                      # the source's path inside the root
MARKER=$ARM_ROOT/.pyattn-ready       # written last: the root is complete

T0=$(date +%s); TIMES=()
lap() { local now; now=$(date +%s); TIMES+=("$(printf '%-22s %4d s' "$1" $((now - T0)))"); T0=$now; }
# Unmount everything under the root (deepest first): never leave the host's
# /proc or /dev mounted there, and never let `rm -rf` walk into them.
unmount_root() { awk -v r="$ARM_ROOT/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r |
                 while read -r m; do umount "$m" || umount -l "$m"; done; }
finish() { rc=$?; unmount_root; echo "== timings"; [ ${#TIMES[@]} -eq 0 ] || printf '  %s\n' "${TIMES[@]}"; echo "== exit $rc"; }
trap finish EXIT

# one run at a time on this machine: the root and its mounts are shared
mkdir -p "$(dirname "$ARM_ROOT")"
exec 9>"$(dirname "$ARM_ROOT")/.lock"
flock 9

echo "== host tools and binfmt_misc"
missing=()
for p in qemu-user-static debootstrap binfmt-support; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64 2>&1 | grep -v 'already enabled' || true
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null ||
  { echo "qemu-aarch64 is not registered in binfmt_misc: aarch64 binaries cannot run" >&2; exit 1; }

# The Debian mirror this machine's apt uses for $SUITE: a deb822 stanza
# (sources.list.d/*.sources) whose Suites lists it, else a classic `deb` line.
mirror() {
  awk -v s="$SUITE" 'BEGIN {RS = ""} {
      n = split($0, L, "\n"); u = ""; ok = 0
      for (i = 1; i <= n; i++) {
        if (L[i] ~ /^URIs:/) { split(L[i], w, /[ \t]+/); u = w[2] }
        if (L[i] ~ /^Suites:/ && (L[i] " ") ~ ("[ \t]" s "[ \t]")) ok = 1
      }
      if (ok && u != "") { print u; exit }
    }' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | grep . && return
  awk -v s="$SUITE" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                                   if ($(i + 1) == s) { print $i; exit } }' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 | grep .
}

echo "== arm64 root: $ARM_ROOT"
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$PACKAGES" ]; then
  echo "reusing it (created $(date -r "$MARKER"))"
else
  MIRROR=${PYATTN_ARM64_MIRROR:-$(mirror)} ||
    { echo "no apt source for '$SUITE' found; set PYATTN_ARM64_MIRROR" >&2; exit 1; }
  echo "incomplete or outdated root: creating it again from $MIRROR"
  unmount_root; rm -rf --one-file-system "$ARM_ROOT"; mkdir -p "$(dirname "$ARM_ROOT")"
  # With qemu-aarch64 registered (flag F), debootstrap runs the second stage
  # itself: the chroot's arm64 binaries run through the host's qemu.
  debootstrap --arch=arm64 --variant=minbase --include="$PACKAGES" "$SUITE" "$ARM_ROOT" "$MIRROR"
  echo "$PACKAGES" > "$MARKER"
fi
chroot "$ARM_ROOT" /bin/true ||
  { echo "aarch64 binaries do not run: is qemu-aarch64 registered in binfmt_misc?" >&2; exit 1; }
echo "chroot runs: $(chroot "$ARM_ROOT" uname -m)"
lap "host tools + root"

# Run a command inside the root with a clean environment (no host venv or PATH)
in_root() { chroot "$ARM_ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
              LANG=C.UTF-8 "$@"; }
mount -t proc proc "$ARM_ROOT/proc"
mount --bind /dev "$ARM_ROOT/dev"

echo "== source and build (CFLAGS=-Werror)"
rm -rf "${ARM_ROOT:?}$SRC"; mkdir -p "$ARM_ROOT$SRC"
git -c safe.directory="$PWD" ls-files -co --exclude-standard -z |
  tar --null --ignore-failed-read -T - -c | tar -x -C "$ARM_ROOT$SRC"
# pyproject.toml's build requirement (setuptools >= 77, for its PEP 639
# license field, with the packaging >= 24.2 it needs) is newer than
# bookworm's setuptools 66: pure-Python wheels from the package index,
# unpacked into the root and used for this build only
ST=/opt/pyattn-setuptools
if [ ! -d "$ARM_ROOT$ST/setuptools" ] || [ ! -d "$ARM_ROOT$ST/packaging" ]; then
  whl=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$whl" "setuptools>=77" "packaging>=24.2"
  rm -rf "${ARM_ROOT:?}$ST"; mkdir -p "$ARM_ROOT$ST"
  for w in "$whl"/*.whl; do python3 -m zipfile -e "$w" "$ARM_ROOT$ST"; done
  rm -rf "$whl"
fi
in_root PYTHONPATH=$ST CFLAGS=-Werror sh -c "cd $SRC && python3 setup.py -q build_ext --inplace -j $(nproc)"
# ml_dtypes (bfloat16 tests): its aarch64 wheel, unpacked beside the source
# for the tests only; without it the bfloat16 cases skip (float16 still runs)
MLD=/opt/pyattn-ml_dtypes
if [ ! -d "$ARM_ROOT$MLD/ml_dtypes" ]; then
  whl=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_aarch64 \
       --python-version 3.11 -d "$whl" "ml_dtypes>=0.4,<0.6"; then
    rm -rf "${ARM_ROOT:?}$MLD"; mkdir -p "$ARM_ROOT$MLD"
    for w in "$whl"/*.whl; do python3 -m zipfile -e "$w" "$ARM_ROOT$MLD"; done
  fi
  rm -rf "$whl"
fi
lap "build"

# the kernel families this build has (csrc/registry.h, PA_FAMILIES): generic neon
FAMILIES=$(in_root sh -c "cd $SRC && python3 -c 'import pyattn._C as C; print(*[w for w, _, built in C.families() if built])'")
[ -n "$FAMILIES" ] || { echo "the aarch64 build lists no kernel family" >&2; exit 1; }
arm_tests() {
  echo "== tests, PYATTN_ISA=$1"
  in_root PYATTN_ISA="$1" PYTHONPATH=$MLD sh -c "cd $SRC && python3 -c 'import pyattn; pyattn.show_config()' &&
      python3 -m pytest -q -p no:cacheprovider $TESTS $([ "$1" = generic ] || echo "$TESTS_SIMD") \
        -k 'not backward_memory' &&
      python3 -m pytest -q -p no:cacheprovider $FRAME_FILES -m frame \
        --subset $([ "$1" = generic ] && echo $FRAME_SUBSET_GENERIC || echo $FRAME_SUBSET_SIMD)"
}
# the families side by side (each mostly one emulated Python thread): .ci/lib.sh
ROOT=$PWD
# shellcheck source=.ci/lib.sh
source .ci/lib.sh
per_family arm_tests $FAMILIES || { echo "FAILED: the tests above" >&2; exit 1; }
lap "tests ($FAMILIES)"
