"""The package imports and reports a version that matches its metadata."""

import configparser
from pathlib import Path

import dslide


def test_version_matches_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    assert dslide.__version__ == cfg["metadata"]["version"]


def _in_fresh_python(code: str, **env) -> str:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**clean, **env}, cwd=Path(__file__).resolve().parents[2])
    return p.stdout.strip()


def test_blas_threads_sleep_only_when_dslide_set_the_variable_before_numpy_loaded_openblas():
    probe = ("import os, dslide; from dslide.train import _blas_threads; from dslide.network import Network; "
             "from dslide.config import Config; "
             "lsh = Network(Config(hidden=(8,), kinds=('dense', 'lsh')), 50, 40); "
             "dense = Network(Config(hidden=(8,)), 50, 40); "
             "print(dslide.BLAS_THREADS_SLEEP, os.environ['OPENBLAS_THREAD_TIMEOUT'], "
             "_blas_threads(lsh, 2), _blas_threads(dense, 2))")
    assert _in_fresh_python(probe) == "True 4 2 2"
    # numpy first: OpenBLAS has read its (unset) variable already, so an LSH network's products run on one thread
    assert _in_fresh_python("import numpy; " + probe) == "False 4 1 2"
    # ... unless the user set the variable
    assert _in_fresh_python("import numpy; " + probe, OPENBLAS_THREAD_TIMEOUT="6") == "True 6 2 2"
