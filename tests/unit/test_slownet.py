"""scripts/slownet.sh: MPI traffic really crosses the capped loopback, the cap holds, the namespace goes away.

These tests need root, iproute2 and network namespaces; elsewhere they are
skipped with the reason. They start MPI jobs themselves (mpiexec -n 2), so
they are not run under an MPI launcher.
"""

import json
import os
import shutil
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOWNET = ROOT / "scripts" / "slownet.sh"
PROBE = ROOT / "scripts" / "slownet_probe.py"
BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
ENV = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _namespaces_available() -> str:
    """'' when namespaces can be made here, else why not."""
    if os.name != "posix" or os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    if not MPIEXEC.exists():
        return f"no mpiexec beside {sys.executable}"
    name = f"dslide-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


REASON = _namespaces_available()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "available")


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def slownet(tmp_path, rate, *cmd, timeout=120):
    stats = tmp_path / f"stats-{rate}.json"
    run = subprocess.run([str(SLOWNET), "--rate", rate, "--stats", str(stats), "--", *map(str, cmd)],
                         capture_output=True, text=True, timeout=timeout, env=ENV)
    return run, (json.loads(stats.read_text()) if stats.exists() else None)


def test_probe_bytes_cross_the_capped_loopback(tmp_path):
    before = namespaces()
    out = tmp_path / "probe.json"
    run, stats = slownet(tmp_path, "100mbit", MPIEXEC, "-n", "2", sys.executable, PROBE,
                         "--mbytes", "5", "--json", out)
    assert run.returncode == 0, run.stderr
    probe = json.loads(out.read_text())
    assert probe["payload_bytes"] == 5_000_000
    # every payload byte (plus TCP/IP headers and acknowledgements) went through the qdisc
    assert stats["qdisc_bytes"] >= probe["payload_bytes"]
    assert stats["qdisc_bytes"] < 1.3 * probe["payload_bytes"]  # and not much else
    assert stats["rate"] == "100mbit" and stats["rate_bps"] == 100_000_000
    assert stats["dropped"] == 0
    # without --delay nothing needs netem; whether the kernel has it is reported either way
    assert ("netem qdisc not available in this kernel" in run.stderr) == (stats["netem"] is False)
    # the cap holds: 5 MB at 100 Mbit/s takes >= 0.4 s (the bucket lets ~6 kB through at once);
    # the lower bound only catches a cap far too tight (the machine may be busy)
    assert probe["mbit_s"] <= 100.0
    assert probe["mbit_s"] >= 30.0
    # the namespace is gone, and it was a new one
    assert stats["namespace"] not in namespaces()
    assert stats["namespace"] not in before
    assert "qdisc sent" in run.stderr


_RTT = """
import socket, statistics, threading, time
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
def echo():
    c, _ = srv.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
threading.Thread(target=echo, daemon=True).start()
cl = socket.create_connection(srv.getsockname()); cl.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
ts = []
for _ in range(7):
    t = time.perf_counter(); cl.sendall(b"x"); cl.recv(1); ts.append(time.perf_counter() - t)
print(statistics.median(ts) * 1000)
"""


def test_delay_is_added_where_netem_exists_and_refused_with_the_reason_elsewhere(tmp_path):
    stats_file = tmp_path / "stats.json"
    run = subprocess.run([str(SLOWNET), "--rate", "none", "--delay", "20ms", "--stats", str(stats_file), "--",
                          sys.executable, "-c", _RTT], capture_output=True, text=True, timeout=60, env=ENV)
    if "netem qdisc is not available" in run.stderr:  # a kernel without CONFIG_NET_SCH_NETEM
        assert run.returncode == 2
        assert "--delay 20ms asked for, but the netem qdisc is not available in this kernel" in run.stderr
        assert run.stdout == ""  # the command never ran
    else:
        assert run.returncode == 0, run.stderr
        stats = json.loads(stats_file.read_text())
        assert stats["netem"] is True and stats["delay"] == "20ms"
        # a request and its answer each cross lo's qdisc once: 2 x 20 ms at least
        assert float(run.stdout.strip().splitlines()[-1]) >= 40.0
    # undelayed, the same round trip takes far less than the 20 ms netem would add
    plain, _ = slownet(tmp_path, "none", sys.executable, "-c", _RTT)
    assert plain.returncode == 0 and float(plain.stdout.strip().splitlines()[-1]) < 20.0


def test_collective_traffic_crosses_the_loopback_too(tmp_path):
    # the all-reduce is MPICH's own algorithm: with shared memory it would send nothing over lo
    out = tmp_path / "probe.json"
    run, stats = slownet(tmp_path, "none", MPIEXEC, "-n", "2", sys.executable, PROBE,
                         "--pattern", "allreduce", "--mbytes", "4", "--json", out)
    assert run.returncode == 0, run.stderr
    probe = json.loads(out.read_text())
    assert probe["payload_bytes"] == 2 * 4_000_000  # two ranks, 2 (P - 1) / P * 4 MB each
    assert stats["qdisc_bytes"] >= probe["payload_bytes"]
    assert stats["rate"] == "none" and stats["rate_bps"] == 0
    assert stats["namespace"] not in namespaces()


def test_dslide_training_bytes_cross_the_loopback(tmp_path):
    prefix = tmp_path / "tiny"
    subprocess.run([sys.executable, "-m", "dslide", "data", "gen", "--preset", "tiny", "--points", "1024",
                    "--test-points", "64", "--out", str(prefix)], check=True, capture_output=True, env=ENV)
    run_dir = tmp_path / "run"
    run, stats = slownet(tmp_path, "100mbit", MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "dslide",
                         "train", "--train", f"{prefix}_train.txt", "--set", "epochs=1", "--set", "threads=1",
                         "--set", "hidden=[128]", "--set", "batch_size=256", "--set", "dropout=0",
                         "--out", run_dir, "--quiet", timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["steps"] == 4
    # hidden 128, batch 256, float32: all-gather + reduce-scatter + the normaliser + the label
    # weights (one softmax per label, the default loss) per rank per step
    assert m["bytes_per_step"] == 2 * 1 / 2 * 256 * 128 * 4 + 2 * 1 / 2 * 16 * 256 + 2 * 1 / 2 * 8 * 256
    sent = m["bytes_per_step"] * m["world_size"] * m["steps"]
    assert stats["qdisc_bytes"] >= sent
    assert stats["namespace"] not in namespaces()


def test_failing_command_keeps_its_status_and_cleans_up(tmp_path):
    run, stats = slownet(tmp_path, "1gbit", "sh", "-c", "ip link show lo | grep -q 'mtu 1500' && exit 3")
    assert run.returncode == 3  # ran inside the namespace (its lo has our MTU), status passed on
    assert stats["exit_code"] == 3
    assert stats["namespace"] not in namespaces()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_removes_the_namespace(tmp_path, sig):
    before = namespaces()
    # SIGINT at its default in the script: a suite run in the background of a shell inherits it
    # ignored, and bash cannot trap a signal ignored on entry (the test then timed out)
    proc = subprocess.Popen([str(SLOWNET), "--rate", "100mbit", "--", "sleep", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    name = f"dslide-{proc.pid}"
    # signal once the command runs (the script says so on stderr just before it starts it)
    head = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(f"namespace {name}," in line for line in head):
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stderr.readline()
        if not line:
            break
        head.append(line)
    assert name in namespaces(), "".join(head)
    time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    err = "".join(head) + err
    assert time.monotonic() - t0 < 10  # did not wait for the 60 s command
    assert proc.returncode == 130
    assert "interrupted" in err
    assert name not in namespaces() and name not in before


@pytest.mark.parametrize("args, message", [
    (["--rate", "fast"], "--rate 'fast' is not valid"),
    (["--mtu", "20"], "--mtu '20' is not valid"),
    (["--bogus"], "unknown argument '--bogus'"),
])
def test_bad_arguments_exit_2(args, message):
    run = subprocess.run([str(SLOWNET), *args, "--", "true"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert message in run.stderr


def test_not_root_exits_2():
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv to drop root")
    run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(SLOWNET),
                          "--rate", "1gbit", "--", "true"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert "needs root" in run.stderr
