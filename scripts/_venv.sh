# Sourced by demo.sh, test.sh and the benchmarks: make sure .venv exists and
# holds this package with its test extra, installing only what is missing.
# Afterwards $PY is the venv's python and $MPIEXEC the launcher beside it
# (or, when the venv has none, the system's).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DSLIDE_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

_find_python() {
    for cand in python3.13 python3.12 python3.11 python3.10 python3; do
        if command -v "$cand" >/dev/null 2>&1 &&
           "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
            command -v "$cand"; return 0
        fi
    done
    echo "dslide needs Python >= 3.10 with the venv module; none found on PATH" >&2
    return 1
}

if [ ! -x "$PY" ]; then
    base_py="$(_find_python)" || exit 1
    echo "[dslide] creating virtual environment $VENV with $base_py"
    "$base_py" -m venv "$VENV" || { echo "[dslide] could not create $VENV (is python3-venv installed?)" >&2; exit 1; }
fi

# Reinstall only when the packaging metadata changed since the last install.
_stamp="$VENV/.dslide-install-stamp"
_want="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | cksum | cut -d' ' -f1)"
if [ ! -f "$_stamp" ] || [ "$(cat "$_stamp")" != "$_want" ] || ! "$PY" -c 'import dslide.lsh, dslide.datasets, pytest, mpi4py' >/dev/null 2>&1; then
    echo "[dslide] installing dslide and its dependencies into $VENV"
    "$PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$PY" -m pip install --quiet -e "$ROOT[test]" || { echo "[dslide] pip install failed" >&2; exit 1; }
    echo "$_want" > "$_stamp"
fi

if [ -x "$VENV/bin/mpiexec" ]; then
    MPIEXEC="$VENV/bin/mpiexec"
else
    MPIEXEC="$(command -v mpiexec || true)"
fi
export PYTHONNOUSERSITE=1
