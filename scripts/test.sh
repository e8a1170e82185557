#!/usr/bin/env bash
# Install what is missing into .venv, then run the whole test suite:
# the unit tests, then the MPI tests at 1, 2 and 3 ranks (3 gives uneven shards).
# Exits non-zero on any failure; each MPI run is under a timeout so a hang fails.
#
# DSLIDE_TEST_CPU=sse or avx: the same suite as on an older CPU's vector width, on this one.
# numba compiles for 128-bit SSE4.2 (sse) or 256-bit AVX without FMA (avx) and OpenBLAS takes
# that CPU's kernels, so float sums run in other orders: a test that pins this CPU's bits fails.
# (A wider CPU, AVX-512, cannot be imitated on a narrower one.) The kernels compile into their
# own cache, $ROOT/.cache/numba-<cpu>, leaving this machine's untouched.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"

case "${DSLIDE_TEST_CPU:-}" in
    "") ;;
    sse) export NUMBA_CPU_NAME=nehalem NUMBA_CPU_FEATURES="-avx,-avx2,-fma,-f16c" OPENBLAS_CORETYPE=Nehalem ;;
    avx) export NUMBA_CPU_NAME=sandybridge NUMBA_CPU_FEATURES="-avx2,-fma,-f16c" OPENBLAS_CORETYPE=SandyBridge ;;
    *) echo "DSLIDE_TEST_CPU=${DSLIDE_TEST_CPU}: expected sse or avx (or unset: this CPU)" >&2; exit 2 ;;
esac
if [ -n "${DSLIDE_TEST_CPU:-}" ]; then
    export NUMBA_CACHE_DIR="$ROOT/.cache/numba-$DSLIDE_TEST_CPU"
    echo "== as on a CPU with ${DSLIDE_TEST_CPU}: numba for $NUMBA_CPU_NAME ($NUMBA_CPU_FEATURES), OpenBLAS $OPENBLAS_CORETYPE"
fi

MPI_TIMEOUT="${DSLIDE_MPI_TIMEOUT:-300}"
export NUMBA_NUM_THREADS="${NUMBA_NUM_THREADS:-2}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
status=0

echo "== unit tests"
# an empty numba cache (a fresh install): `dslide warm` fills it on the second core while the
# tests start on the first, so that most kernels they reach are loaded rather than compiled;
# niced, so that a test that wants both cores (several ranks, a timeout) comes first
nice -n 10 "$PY" -m dslide warm >/dev/null 2>&1 &
warm=$!
"$PY" -m pytest tests/unit -q "$@" || status=1
wait "$warm" || true

echo "== first run: silent for at most 10 s while numba compiles (an empty cache)"
"$PY" -m scripts.first_run_check -- "$PY" -m dslide data gen --preset tiny --points 500 \
    --out "$(mktemp -d)/tiny" || status=1

if [ -z "$MPIEXEC" ]; then
    echo "== MPI tests: no mpiexec found beside $PY or on PATH" >&2
    exit 1
fi
for np in 1 2 3; do
    echo "== MPI tests, $np rank(s)"
    # python -m mpi4py turns an uncaught exception on one rank into MPI_Abort for all.
    NUMBA_NUM_THREADS=1 timeout --kill-after=10 "$MPI_TIMEOUT" \
        "$MPIEXEC" -n "$np" "$PY" -m mpi4py -m pytest tests/mpi -q -p no:cacheprovider "$@"
    rc=$?
    if [ $rc -ne 0 ]; then
        [ $rc -eq 124 ] && echo "MPI tests at $np ranks timed out after ${MPI_TIMEOUT}s" >&2
        status=1
    fi
done

if [ $status -eq 0 ]; then echo "== all tests passed"; else echo "== some tests FAILED" >&2; fi
exit $status
