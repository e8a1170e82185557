"""scripts/measure.py, what every benchmark shares: the thread environment, a child's command line,
the peak memory of a process tree, time to a target P@1, the record in docs/benchmarks.md."""

from __future__ import annotations

import sys

import pytest

from scripts import measure as M

# a child that holds about 60 MB for a moment, and a grandchild that holds about 120 MB
HOLD = "import time; b = bytearray({mb} << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep({s})"


def test_thread_env_sets_every_thread_variable_and_keeps_the_rest():
    env = M.thread_env(3, {"PATH": "/bin", "OMP_NUM_THREADS": "8"}, OMP_WAIT_POLICY="PASSIVE")
    assert {v: env[v] for v in M.THREAD_VARS} == {v: "3" for v in M.THREAD_VARS}
    assert env["PATH"] == "/bin" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert set(M.thread_env(1, {})) == set(M.THREAD_VARS)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            M.thread_env(bad, {})


def test_module_cmd_runs_the_package_module_under_mpi_when_asked():
    assert M.module_cmd("_bench", "child", 7, python="py") == ["py", "-m", "scripts._bench", "child", "7"]
    cmd = M.module_cmd("bench_hetero", "x", ranks=4, python="py")
    assert cmd[:3] == [M.mpiexec(), "-n", "4"] and cmd[3:] == ["py", "-m", "mpi4py", "-m", "scripts.bench_hetero", "x"]
    assert M.module_cmd("bench_scale", ranks=1, mpi=True, python="py")[:3] == [M.mpiexec(), "-n", "1"]


def test_a_module_child_finds_the_package_from_the_root():
    p, _ = M.run(M.module_cmd("measure", "--help"), timeout=120)
    assert p.returncode == 0 and "What every benchmark measures" in p.stdout


def test_run_measures_the_peak_of_a_process_tree():
    child = (f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLD.format(mb=120, s=1.5)!r}]); "
             + HOLD.format(mb=60, s=1.5))
    p, peak = M.run([sys.executable, "-c", child], interval=0.1, timeout=120)
    assert p.returncode == 0, p.stderr
    assert peak.processes >= 2
    assert 120 <= peak.largest_mb < 400          # the grandchild, not its parent
    assert peak.total_mb >= peak.largest_mb + 60  # both processes' peaks


def test_peak_rss_mb_is_this_process_s_own():
    before = M.peak_rss_mb()
    block = bytearray(80 << 20)
    block[::4096] = b"x" * len(block[::4096])
    assert M.peak_rss_mb() >= before and M.peak_rss_mb() >= 80
    assert M.status_bytes("VmRSS:") > 0


def test_time_to_reads_the_first_evaluation_at_the_target():
    curve = [{"wall_s": 1.0, "loss": 2.0}, {"wall_s": 2.0, "p@1": 0.4}, {"wall_s": 3.0, "p@1": 0.6},
             {"wall_s": 4.0, "p@1": None}, {"wall_s": 5.0, "p@1": 0.7}]
    assert M.time_to(curve, 0.5) == 3.0 and M.time_to(curve, 0.7) == 5.0 and M.time_to(curve, 0.8) is None


def test_record_replaces_its_own_section_only(tmp_path, monkeypatch):
    monkeypatch.setattr(M, "ROOT", tmp_path)
    M.record("bench_x.py", "first")
    M.record("bench_y.py", "other")
    M.record("bench_x.py", "second")
    doc = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "second" in doc and "first" not in doc and "other" in doc
    assert doc.count("<!-- bench_x.py -->") == 1 and "## `scripts/bench_x.py`" in doc


def test_record_puts_a_new_section_above_the_history_list(tmp_path, monkeypatch):
    monkeypatch.setattr(M, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\n{M.HISTORY}\n## History\n\n- older runs\n")
    M.record("bench_x.py", "first")
    M.record("bench_y.py", "other")
    M.record("bench_x.py", "second")
    doc = page.read_text()
    assert doc.index("second") < doc.index("other") < doc.index(M.HISTORY) < doc.index("- older runs")
    assert "first" not in doc and doc.count(M.HISTORY) == 1


def test_table_formats_keys_and_callables():
    text = M.table([{"a": 1.23456, "b": "x"}], [("A", "a"), ("B", lambda r: r["b"] * 2)])
    assert text.splitlines() == ["| A | B |", "|---|---|", "| 1.235 | xx |"]


def test_cpu_model_names_the_cpu_and_its_widest_vector_instructions():
    from scripts.measure import cpu_model

    def info(name, flags):
        return f"processor\t: 0\nmodel name\t: {name}\nflags\t\t: {flags}\n\nprocessor\t: 1\nmodel name\t: other\n"

    assert cpu_model(info("AMD  EPYC", "fpu sse2 avx avx2 fma")) == "AMD EPYC, AVX2"
    assert cpu_model(info("Intel Xeon", "avx avx2 avx512f avx512bw amx_tile amx_bf16")) == "Intel Xeon, AVX-512, AMX"
    assert cpu_model(info("Old", "sse2")) == "Old"
    assert cpu_model("") == ""
