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
    probe = ("import os, dslide; from dslide.train.loop import _blas_threads; from dslide.model.network import Network; "
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


# ----------------------------------------------------------------------------
# Import names: dslide installs under its own name only
# ----------------------------------------------------------------------------

_PROBE = """
import importlib.util, json, sys
sys.path[:0] = {path!r}
import dslide.lsh, dslide.datasets.synthetic, dslide.datasets.arff
def where(name):
    spec = importlib.util.find_spec(name)
    return None if spec is None else (spec.origin or str(list(spec.submodule_search_locations or [])))
print(json.dumps({{"dslide": dslide.__file__, "dslide.lsh": dslide.lsh.__file__,
                  "dslide.datasets": dslide.datasets.__file__, "lsh": where("lsh"), "datasets": where("datasets")}}))
"""


def _probe(cwd, path=()):
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _PROBE.format(path=list(map(str, path)))], capture_output=True,
                       text=True, cwd=cwd)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _not_ours(found, *roots):
    """`import <name>` finds nothing, or something that is not one of our files."""
    return found is None or not any(str(r) in found for r in roots)


def test_the_editable_install_has_lsh_and_datasets_under_dslide_only(tmp_path):
    root = Path(__file__).resolve().parents[2]
    got = _probe(tmp_path)  # outside the repository: the current directory must not help
    assert got["dslide.lsh"] == str(root / "dslide" / "lsh" / "__init__.py")
    assert got["dslide.datasets"] == str(root / "dslide" / "datasets" / "__init__.py")
    assert _not_ours(got["lsh"], root) and _not_ours(got["datasets"], root), got


def test_python_m_dslide_datasets_synthetic_runs(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "dslide.datasets.synthetic", "--preset", "tiny", "--stats",
                        "--points", "200"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "200" in p.stdout


def test_the_wheel_holds_and_installs_only_dslide(tmp_path):
    """Build the wheel as `pip install .` would (offline: the venv's setuptools), install it
    (not editable) into a directory, and import from there in a fresh interpreter."""
    import shutil
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    shutil.copytree(root / "dslide", src / "dslide", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("dslide-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"dslide-{dslide.__version__}.dist-info"
    assert {n.split("/")[0] for n in names} == {"dslide", info}
    assert zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split() == ["dslide"]
    for f in (root / "dslide").rglob("*.py"):  # subpackages too: setup.cfg must list each
        assert f.relative_to(root).as_posix() in names, f
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
                    str(wheel)], check=True, capture_output=True)
    got = _probe(tmp_path, [site])
    for name in ("dslide", "dslide.lsh", "dslide.datasets"):
        assert got[name].startswith(str(site)), got
    assert got["dslide.lsh"] == str(site / "dslide" / "lsh" / "__init__.py")
    assert _not_ours(got["lsh"], root, site) and _not_ours(got["datasets"], root, site), got
