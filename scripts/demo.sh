#!/usr/bin/env bash
# Install what is missing into .venv, then run the main job.
# (Until the trainer lands: generate the default synthetic data set and print its statistics.)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
"$PY" -m datasets.synthetic --preset small --stats
