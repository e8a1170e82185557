"""A failure on one rank ends every rank with its message, never a hang."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dslide.datasets.synthetic import generate_split, write
from tests import faults

MPIEXEC = Path(sys.executable).with_name("mpiexec")


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
def test_an_exception_on_one_rank_ends_all_ranks(tmp_path):
    train, test = generate_split("tiny", n_train=800, n_test=100, seed=0)
    tr, te = write(str(tmp_path / "t"), train, test)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI_"))}
    env.update(faults.env("raise-rank1-step3"), NUMBA_NUM_THREADS="1")
    t0 = time.monotonic()
    # no `-m mpi4py` here: the dslide command's own hook must end the other rank
    p = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "dslide", "train", "--train", tr,
                        "--out", str(tmp_path / "run"), "--quiet", "--set", "batch_size=32"],
                       env=env, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0, p.stderr
    assert "dslide (rank 1 of 2): internal error: RuntimeError: injected fault on rank 1 at step 3" in p.stderr, p.stderr
    assert elapsed < 200
