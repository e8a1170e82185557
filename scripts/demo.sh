#!/usr/bin/env bash
# The main job: install what is missing into .venv, compile the kernels (dslide warm), make the built-in data set
# (the `small` synthetic preset: 20,000 training points, 50,000 features,
# 20,000 labels) if it is not there yet, train on it with 2 MPI ranks of one
# thread each, evaluate, and draw the run's progress.
#   DEMO_EPOCHS=3 ./scripts/demo.sh      (default 5 epochs: about a minute of training on 2 cores)
#   DEMO_RANKS, DEMO_DATA (data prefix, default data/small), DEMO_RUN (default runs/demo)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"

RANKS="${DEMO_RANKS:-2}"
EPOCHS="${DEMO_EPOCHS:-5}"
DATA="${DEMO_DATA:-$ROOT/data/small}"
RUN="${DEMO_RUN:-$ROOT/runs/demo}"

if ! "$PY" -c 'import matplotlib' >/dev/null 2>&1; then
    echo "[dslide] installing the plotting extra (matplotlib) into $VENV"
    "$PY" -m pip install --quiet -e "$ROOT[test,plot]" || echo "[dslide] matplotlib could not be installed: no plot"
fi
# Compile the kernels in one process, with progress lines, before the ranks need them (minutes
# once after an install or a code change; seconds to load them afterwards).
"$PY" -m dslide warm
if [ ! -f "${DATA}_train.txt" ] || [ ! -f "${DATA}_test.txt" ]; then
    mkdir -p "$(dirname "$DATA")"
    "$PY" -m dslide data gen --preset small --out "$DATA"
fi
[ -n "$MPIEXEC" ] || { echo "[dslide] no mpiexec found beside $PY or on PATH" >&2; exit 1; }

rm -rf "$RUN"
# One thread per rank: the two ranks share the two cores. `-m mpi4py` ends
# every rank if one fails (dslide's own error handler does too).
NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
"$MPIEXEC" -n "$RANKS" "$PY" -m mpi4py -m dslide train \
    --train "${DATA}_train.txt" --test "${DATA}_test.txt" --out "$RUN" \
    --set epochs="$EPOCHS" --set eval_every=40 --set log_every=20 "$@"

if "$PY" -c 'import matplotlib' >/dev/null 2>&1; then
    "$PY" -m dslide plot "$RUN" --out "$RUN/progress.png" --labels "dslide: $RANKS ranks x 1 thread" >/dev/null
    echo "plot of P@1 and loss against time: $RUN/progress.png"
fi
