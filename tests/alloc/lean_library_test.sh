#!/usr/bin/env bash
# libghtier_alloc.so, the allocator library that PyTorch loads, must not bring its own cuBLAS,
# cuDNN, TBB or OpenMP runtime into the process: loading libghtier.so (which had them) before
# `import torch` crashed inside torch's import (issue 12). Checks the library's direct
# dependencies (readelf -d) and everything the loader would pull in (ldd), and that libghtier.so
# reaches the allocator through it rather than carrying a second copy.
#   bash tests/alloc/lean_library_test.sh <build-lib-dir>
set -euo pipefail
LIBDIR=${1:?usage: lean_library_test.sh <build-lib-dir>}
LEAN="$LIBDIR/libghtier_alloc.so"
FULL="$LIBDIR/libghtier.so"
FORBIDDEN='cublas|cudnn|tbb|gomp|libomp|iomp'
fail() { echo "FAIL: $*" >&2; exit 1; }

[ -f "$LEAN" ] || fail "$LEAN not built"
needed=$(readelf -d "$LEAN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "libghtier_alloc.so NEEDED:"; sed 's/^/  /' <<<"$needed"
[ -n "$needed" ] || fail "readelf -d lists no NEEDED entries for $LEAN"
if grep -Eiq "$FORBIDDEN" <<<"$needed"; then
  fail "libghtier_alloc.so needs $(grep -Ei "$FORBIDDEN" <<<"$needed" | tr '\n' ' ')"
fi
loaded=$(ldd "$LEAN")
echo "ldd libghtier_alloc.so:"; sed 's/^/  /' <<<"$loaded"
! grep -q 'not found' <<<"$loaded" || fail "ldd cannot resolve a dependency of $LEAN"
if grep -Eiq "$FORBIDDEN" <<<"$loaded"; then
  fail "libghtier_alloc.so loads $(grep -Ei "$FORBIDDEN" <<<"$loaded" | awk '{print $1}' | tr '\n' ' ')"
fi
# The C ABI and PyTorch's entry points are exported by the lean library.
syms=$(nm -D --defined-only "$LEAN")
for s in ght_init ght_malloc ght_free ght_where ght_stats_json ght_torch_malloc ght_torch_free; do
  grep -Eq " T $s\$" <<<"$syms" || fail "$LEAN does not export $s"
done
# libghtier.so builds on the lean library instead of holding its own allocator.
if [ -f "$FULL" ]; then
  readelf -d "$FULL" | grep -q 'NEEDED.*\[libghtier_alloc\.so' || fail "libghtier.so does not need libghtier_alloc.so"
  ! nm -D --defined-only "$FULL" | grep -Eq ' T ght_torch_malloc$' ||
    fail "libghtier.so defines ght_torch_malloc itself (a second allocator instance)"
fi
echo "lean_library_test: ok"
