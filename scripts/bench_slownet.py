"""dslide against data parallelism on a slow network, measured on one machine.

    sudo .venv/bin/python -m scripts.bench_slownet            # the full benchmark (~30 min)
    .venv/bin/python -m scripts.bench_slownet --replot docs/slownet.json   # tables and plot again

For each cap (unlimited, 1 Gbit/s, 100 Mbit/s; scripts/slownet.sh puts every
rank in a network namespace whose loopback is capped with tc tbf, and makes
MPICH send over TCP on it):
  1. calibrates the cap with scripts/slownet_probe.py: payload bandwidth of a
     one-way stream (TCP/IP headers and acknowledgements cost ~6%) and the
     half round trip of a 1-byte ping-pong (best of --repeats);
  1b. checks the model's all-reduce time against one MPI all-reduce per cap and P;
  2. trains the same Amazon-like model (670,091 labels, hidden 128, batch 256)
     with dslide (model parallel, LSH output layer) and with the data-parallel
     baseline (`parallel=data`, which needs dense layers: `exact=true`, the
     gradient all-reduce Horovod and PyTorch DDP perform), at P = 1 (unlimited
     only), 2 and 4 ranks, one thread each (a rank is a one-core node);
     records time per step (the median over the run's steps after the first,
     compiling one, from log.jsonl with log_every=1: the median resists the
     other jobs that share the machine), samples/s (batch / that median, and
     dslide's own mean), bytes per step, and the qdisc's byte counter, which
     must be at least the bytes all ranks sent (the check that the traffic
     went through the cap);
  3. fits scripts/_costmodel.py's compute terms from the unlimited runs (per P:
     measured time minus the model's communication on the unlimited link) and
     predicts every capped run from the calibrated bandwidth and latency
     (`shared_medium=True`: all ranks share the one capped loopback); reports
     each prediction's error;
  4. fits each scheme's split and fixed compute from P = 1 and 2 (one core
     per rank; P = 4 shares 2 cores) and predicts time per step on 1..64
     nodes with switched links (each node its own link) at 10 Gbit/s,
     1 Gbit/s and 100 Mbit/s, latency --latency-us.
Writes docs/slownet.md (tables), docs/slownet.png (plots; needs matplotlib,
an optional extra: `.venv/bin/pip install matplotlib`) and docs/slownet.json
(every number, for --replot).

Needs root (network namespaces, tc), iproute2 and the `dslide` command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import _costmodel as C
from . import measure as M

ROOT = M.ROOT

SLOWNET = ROOT / "scripts" / "slownet.sh"
PROBE = ROOT / "scripts" / "slownet_probe.py"
PY = Path(sys.executable)
MPIEXEC = PY.parent / "mpiexec"

CAP_LABEL = {"none": "unlimited", "10gbit": "10 Gbit/s", "1gbit": "1 Gbit/s", "100mbit": "100 Mbit/s"}
METHODS = ("dslide", "data-parallel")
BATCH, HIDDEN, ITEMSIZE = 256, 128, 4
SCALING_P = (1, 2, 4, 8, 16, 32, 64)
SCALING_LINKS = (("10 Gbit/s", 10e9), ("1 Gbit/s", 1e9), ("100 Mbit/s", 100e6))


def say(msg: str) -> None:
    print(f"[bench_slownet {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def rate_bits(rate: str) -> float:
    """Nominal bits/s of a slownet.sh --rate ('none': inf)."""
    if rate == "none":
        return math.inf
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for u, f in units.items():
        if rate.endswith(u):
            try:
                return float(rate[: -len(u)]) * f
            except ValueError:
                break
    raise ValueError(f"cap {rate!r} is not valid; give none or <number><unit> with unit bit, kbit, mbit, gbit, tbit")


def run_env() -> dict:
    # one core per rank: numba, BLAS and OpenMP single-threaded
    return M.thread_env(1, PYTHONUNBUFFERED="1")


OPTS = {"yield": True, "quiet_wait_s": 300.0, "quiet_busy": 0.35}


def cpu_busy(interval: float = 2.0) -> float:
    """Fraction of all cores busy over `interval` seconds (from /proc/stat)."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet() -> float:
    """Wait (up to OPTS['quiet_wait_s']) until other work leaves the cores mostly idle; returns the last busy fraction.

    Other jobs share this machine; a timing taken while they run says more about them than about us.
    """
    deadline = time.monotonic() + OPTS["quiet_wait_s"]
    busy = cpu_busy()
    waited = False
    while busy > OPTS["quiet_busy"] and time.monotonic() < deadline:
        if not waited:
            say(f"  machine {100 * busy:.0f}% busy with other work; waiting up to {OPTS['quiet_wait_s']:.0f} s")
            waited = True
        time.sleep(8)
        busy = cpu_busy()
    if waited:
        say(f"  going on at {100 * busy:.0f}% busy")
    return busy


def slownet(rate: str, cmd: list, stats: Path, log: Path, timeout: float) -> dict:
    """Run cmd under scripts/slownet.sh --rate rate; returns the qdisc stats (raises on failure)."""
    stats.unlink(missing_ok=True)
    extra = ["--yield"] if OPTS["yield"] else []
    with open(log, "w") as f:
        try:
            proc = subprocess.run([str(SLOWNET), "--rate", rate, *extra, "--stats", str(stats), "--", *map(str, cmd)],
                                  stdout=f, stderr=subprocess.STDOUT, env=run_env(), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {timeout:.0f} s: {' '.join(map(str, cmd))} (log: {log})") from None
    if proc.returncode == 2 and not stats.exists():
        raise SystemExit(f"scripts/slownet.sh cannot emulate a network here:\n{log.read_text()[-2000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode} at --rate {rate}: {' '.join(map(str, cmd))}\n"
                           f"{log.read_text()[-3000:]}")
    return json.loads(stats.read_text())


# -- 1. calibration ---------------------------------------------------------------------------


def calibrate(rate: str, work: Path, repeats: int) -> dict:
    """Payload bandwidth (bytes/s, one stream) and latency (s, half round trip) of a cap: best of `repeats`."""
    bits = rate_bits(rate)
    # ~2 s of streaming at the cap (200 MB when unlimited)
    mbytes = 200.0 if math.isinf(bits) else max(5.0, min(200.0, bits / 8 * 2.0 / 1e6))
    best = None
    for i in range(repeats):
        out = work / f"probe-{rate}-{i}.json"
        wait_quiet()
        stats = slownet(rate, [MPIEXEC, "-n", 2, PY, PROBE, "--mbytes", mbytes, "--json", out],
                        work / f"probe-{rate}-{i}.stats.json", work / f"probe-{rate}-{i}.log", timeout=600)
        p = json.loads(out.read_text())
        rec = {"rate": rate, "nominal_bits": bits, "payload_bytes": p["payload_bytes"], "seconds": p["seconds"],
               "bandwidth": p["payload_bytes"] / p["seconds"], "latency": p["latency_us"] * 1e-6,
               "qdisc_bytes": stats["qdisc_bytes"], "dropped": stats["dropped"], "burst_bytes": stats["burst_bytes"],
               "netem": stats["netem"]}
        if best is None:
            best = rec
        else:
            best["latency"] = min(best["latency"], rec["latency"])
            if rec["bandwidth"] > best["bandwidth"]:
                rec["latency"] = best["latency"]
                best = rec
        say(f"  probe {rate}: {p['payload_bytes'] * 8 / p['seconds'] / 1e6:,.1f} Mbit/s payload, "
            f"latency {p['latency_us']:.1f} us, qdisc {stats['qdisc_bytes']:,} B for {p['payload_bytes']:,} B")
    return best


def collective_check(rate: str, P: int, link: dict, work: Path, repeats: int) -> dict:
    """One MPI all-reduce of ~4 s worth of bytes at the cap, timed (best of `repeats`), against the model's ring all-reduce."""
    mbytes = max(1.0, link["bandwidth"] * 4.0 / (2 * (P - 1)) / 1e6)  # all ranks move 2 (P - 1) x the buffer
    best = None
    for i in range(repeats):
        out = work / f"allreduce-{rate}-P{P}-{i}.json"
        wait_quiet()
        stats = slownet(rate, [MPIEXEC, "-n", P, PY, PROBE, "--pattern", "allreduce", "--mbytes", mbytes, "--json", out],
                        work / f"allreduce-{rate}-P{P}-{i}.stats.json", work / f"allreduce-{rate}-P{P}-{i}.log",
                        timeout=600)
        p = json.loads(out.read_text())
        if best is None or p["seconds"] < best["measured_s"]:
            n = int(mbytes * 1e6) // 4 * 4
            pred = C.allreduce_time(P, n, link["bandwidth"], link["latency"], "ring", shared_medium=True)
            best = {"rate": rate, "P": P, "buffer_bytes": n, "payload_bytes": p["payload_bytes"],
                    "measured_s": p["seconds"], "predicted_s": pred, "error": pred / p["seconds"] - 1.0,
                    "qdisc_bytes": stats["qdisc_bytes"], "qdisc_ok": stats["qdisc_bytes"] >= p["payload_bytes"]}
    say(f"  all-reduce {rate} P={P}: {_bytes(best['buffer_bytes'])} in {best['measured_s']:.3f} s, model "
        f"{best['predicted_s']:.3f} s ({100 * best['error']:+.1f}%), qdisc {best['qdisc_bytes']:,} B")
    return best


def res_model_bytes(data: Path) -> int:
    with open(f"{data}_train.txt") as f:
        _, n_features, n_labels = map(int, f.readline().split())
    return model_bytes_of(n_features, n_labels)


# -- 2. training runs -----------------------------------------------------------------------------


def run_record(method: str, P: int, rate: str, work: Path, tag: str) -> dict:
    """The record of one finished run, from its files: metrics.json, log.jsonl, the qdisc stats, busy/wall notes."""
    run_dir = work / "runs" / tag
    m = json.loads((run_dir / "metrics.json").read_text())
    stats = json.loads((work / f"{tag}.stats.json").read_text())
    notes_path = work / f"{tag}.notes.json"
    notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    times = step_times(run_dir / "log.jsonl")
    sent = m["bytes_per_step"] * m["world_size"] * m["steps"]
    return {"method": method, "P": P, "rate": rate, "tag": tag, "steps": m["steps"], "step_times_s": times,
            "step_s": median(times), "samples_per_s": BATCH / median(times),
            "mean_samples_per_s": m["samples_per_s"], "bytes_per_step": m["bytes_per_step"],
            "bytes_per_step_data_parallel": m["bytes_per_step_data_parallel"], "sent_bytes": sent,
            "qdisc_bytes": stats["qdisc_bytes"], "qdisc_packets": stats["qdisc_packets"],
            "dropped": stats["dropped"], "qdisc_ok": stats["qdisc_bytes"] >= sent,
            **{k: notes[k] for k in ("busy_before", "run_wall_s") if k in notes},
            "peak_rss_mb": m.get("peak_rss_mb"), "p@1": m.get("p@1")}


def tags_of(method: str, P: int, rate: str, repeats: int) -> list[str]:
    return [f"{method}-P{P}-{rate}-{i}" for i in range(repeats)]


def train_run(method: str, P: int, rate: str, data: Path, steps: int, points: int, work: Path, repeats: int) -> dict:
    """Best of `repeats` runs of `dslide train` under the cap; metrics plus the qdisc check."""
    steps_per_epoch = -(-points // BATCH)
    epochs = steps / steps_per_epoch
    best = None
    for tag in tags_of(method, P, rate, repeats):
        run_dir = work / "runs" / tag
        # a fresh directory: the CLI appends to log.jsonl, and old steps would mix with new ones
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [MPIEXEC, "-n", P, PY, "-m", "mpi4py", "-m", "dslide", "train",
               "--train", f"{data}_train.txt", "--test", f"{data}_test.txt",
               "--set", f"epochs={epochs!r}", "--set", "threads=1", "--set", f"batch_size={BATCH}",
               "--set", f"hidden={HIDDEN}", "--set", "log_every=1", "--set", "eval_points=64",
               "--out", run_dir, "--quiet"]
        if method == "data-parallel":
            cmd += ["--set", "parallel=data", "--set", "exact=true"]
        # every run ends with a checkpoint: P x (weights + Adam moments) when data parallel
        need = 3 * res_model_bytes(data) * (P if method == "data-parallel" else 1) + (1 << 30)
        free = shutil.disk_usage(work).free
        if free < need:
            raise SystemExit(f"only {free / 1e9:.1f} GB free in {work}; a {method} run at P = {P} writes a "
                             f"{need / 1e9:.1f} GB checkpoint (deleted after the run); free some space")
        busy = wait_quiet()
        t0 = time.perf_counter()
        try:
            slownet(rate, cmd, work / f"{tag}.stats.json", work / f"{tag}.log", timeout=3600)
        finally:
            # the timings need metrics.json and log.jsonl only; checkpoints of a 415 MB model are GBs
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        wall = time.perf_counter() - t0
        (work / f"{tag}.notes.json").write_text(json.dumps({"busy_before": busy, "run_wall_s": wall}))
        rec = run_record(method, P, rate, work, tag)
        say(f"  {method:13s} P={P} {rate:8s}: {rec['step_s'] * 1e3:10,.1f} ms/step, "
            f"{rec['samples_per_s']:8,.1f} samples/s, {rec['bytes_per_step']:13,.0f} B/step/rank, "
            f"qdisc {rec['qdisc_bytes']:,} B >= sent {rec['sent_bytes']:,.0f} B: {rec['qdisc_ok']} ({wall:.0f} s)")
        if best is None or rec["step_s"] < best["step_s"]:
            best = rec
    return best


def step_times(log: Path) -> list[float]:
    """Seconds of each training step after the first (which compiles), from a run's log.jsonl
    written with log_every=1 (one record per step, `wall_s` the training time so far; the last run's
    records when the file holds several)."""
    recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "wall_s" in r and "step" in r]
    # the CLI appends: when the directory held earlier runs, keep the last run's records
    starts = [i for i, (a, b) in enumerate(zip(recs, recs[1:]), 1) if b["step"] <= a["step"]]
    recs = recs[starts[-1]:] if starts else recs
    times = [b["wall_s"] - a["wall_s"] for a, b in zip(recs, recs[1:]) if b["step"] == a["step"] + 1]
    if not times:
        raise RuntimeError(f"{log}: fewer than 2 consecutive step records; cannot time steps")
    return times


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


# -- 3./4. the model -------------------------------------------------------------------------------


def model_bytes_of(n_features: int, n_labels: int) -> int:
    """Bytes of the whole model (float32): first layer F x d + d, output d x L + L."""
    return ITEMSIZE * (n_features * HIDDEN + HIDDEN + HIDDEN * n_labels + n_labels)


def comm_time(method: str, P: int, link: dict, model_bytes: float, shared: bool = True) -> float:
    bw, lat = link["bandwidth"], link["latency"]
    if method == "dslide":
        return C.dslide_step_breakdown(P, bw, lat, BATCH, HIDDEN, 0.0, itemsize=ITEMSIZE, shared_medium=shared)["comm"]
    return C.data_parallel_step_breakdown(P, bw, lat, model_bytes, 0.0, shared_medium=shared)["comm"]


def analyse(res: dict) -> dict:
    links = res["calibration"]
    runs = {(r["method"], r["P"], r["rate"]): r for r in res["runs"]}
    M = res["model_bytes"]
    out = {"checks": [], "fits": {}, "scaling": {}}
    # 3. per P: compute = unlimited time - modelled unlimited communication; predict the capped runs
    for (method, P, rate), r in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1], rate_bits(kv[0][2]))):
        base = runs.get((method, P, "none"))
        if rate == "none" or base is None or P == 1:
            continue
        compute = max(0.0, base["step_s"] - comm_time(method, P, links["none"], M))
        comm = comm_time(method, P, links[rate], M)
        pred = compute + comm
        out["checks"].append({"method": method, "P": P, "rate": rate, "measured_s": r["step_s"],
                              "compute_s": compute, "comm_s": comm, "predicted_s": pred,
                              "error": pred / r["step_s"] - 1.0})
    # 4. dslide: split and fixed compute from P = 1 and 2 (one core per rank; P = 4 shares cores).
    #    Data parallel: compute_1 / P, the module's formula; it leaves out the whole-model
    #    optimizer update every replica does, so it flatters the baseline.
    pts = [(P, runs[("dslide", P, "none")]["step_s"] - comm_time("dslide", P, links["none"], M))
           for P in (1, 2) if ("dslide", P, "none") in runs]
    if pts:
        step = C.fit_step([p for p, _ in pts], [max(0.0, t) for _, t in pts])
        out["fits"]["dslide"] = {"compute_split_s": step.compute_split_s, "compute_fixed_s": step.compute_fixed_s,
                                 "from_P": [p for p, _ in pts]}
    if ("data-parallel", 1, "none") in runs:
        out["fits"]["data-parallel"] = {"compute_split_s": runs[("data-parallel", 1, "none")]["step_s"],
                                        "compute_fixed_s": 0.0, "from_P": [1]}
    if set(out["fits"]) == set(METHODS):
        ds = C.Step(out["fits"]["dslide"]["compute_split_s"], out["fits"]["dslide"]["compute_fixed_s"])
        dp = C.Step(out["fits"]["data-parallel"]["compute_split_s"], out["fits"]["data-parallel"]["compute_fixed_s"])
        for name, bits in SCALING_LINKS:
            out["scaling"][name] = C.predict_table(SCALING_P, bits / 8, res["latency_us"] * 1e-6, batch=BATCH,
                                                   hidden=HIDDEN, model_bytes=M, dslide=ds, data_parallel=dp,
                                                   itemsize=ITEMSIZE)
    return out


# -- output ---------------------------------------------------------------------------------------------


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.1f} s"


def _bytes(b: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:,.1f} {unit}"
    return f"{b:,.0f} B"


def markdown(res: dict, an: dict) -> str:
    L = []
    L.append("# dslide on a slow network: measured on one machine\n")
    L.append(f"Generated by `scripts/bench_slownet.py` on {res['date']} ({res['host']}, {res['cores']} cores). "
             f"Amazon-like synthetic data: {res['points']:,} training points, {res['n_features']:,} features, "
             f"{res['n_labels']:,} labels; hidden {HIDDEN}, batch {BATCH}, float32; model "
             f"{_bytes(res['model_bytes'])}. One thread per rank (a rank is a one-core node); "
             f"P = 4 shares the machine's {res['cores']} cores (2 ranks per core). dslide: model parallel, "
             f"LSH output layer (default settings). Data parallel: `parallel=data`, dense layers "
             f"(`exact=true`, which data parallelism needs), the gradient all-reduce of Horovod/DDP. "
             f"Steps per run: dslide {res['steps']['dslide']}, data parallel {res['steps']['data-parallel']} "
             f"(the first, compiling step is left out; time per step is the median over a run's steps, "
             f"samples/s = batch / that median, `mean samples/s` is dslide's own figure over all steps, "
             f"periodic LSH table upkeep included); best of {res['repeats']} run(s) "
             f"({res.get('dp_capped_repeats', res['repeats'])} for the capped data-parallel ones, minutes each).\n")
    L.append("Every rank runs inside a private network namespace (`scripts/slownet.sh`) whose loopback is "
             "capped by a `tc tbf` qdisc; MPICH sends over TCP on it (`MPIR_CVAR_NOLOCAL=1`, "
             "`MPIR_CVAR_CH4_NETMOD=ofi`, `FI_PROVIDER=tcp`). All ranks share that one link, so with P ranks "
             "sending at once each gets about 1/P of the cap; the model is fitted with `shared_medium=True`. "
             + ("" if res.get("netem") else "The kernel has no `netem` qdisc, so no delay is added: latency is the "
                                             "loopback's own, and the cost model's latency term covers slower networks. ")
             + ("Ranks waiting for the network sleep between polls (`slownet.sh --yield`, "
                "`MPIR_CVAR_ENABLE_HEAVY_YIELD=1`) instead of spinning on the shared cores; this raises the "
                "1-byte latency to ~90 us, which the calibration measures. " if res.get("yield") else "")
             + f"Before each run the benchmark waits (up to {res.get('quiet_wait_s', 300) / 60:g} min) for other "
               "work on the machine to finish; "
               "the `busy` column is the machine's CPU use by others just before the run.\n")
    L.append("## Calibration (scripts/slownet_probe.py, one TCP stream between 2 ranks)\n")
    L.append("| cap | payload bandwidth | latency (half round trip) | qdisc bytes / payload | tbf burst |")
    L.append("|---|---:|---:|---:|---:|")
    for rate in res["caps"]:
        c = res["calibration"][rate]
        L.append(f"| {CAP_LABEL.get(rate, rate)} | {c['bandwidth'] * 8 / 1e6:,.1f} Mbit/s | "
                 f"{c['latency'] * 1e6:.1f} us | {c['qdisc_bytes'] / c['payload_bytes']:.3f} | "
                 f"{'-' if c['burst_bytes'] is None or rate == 'none' else _bytes(c['burst_bytes'])} |")
    L.append("")
    if res.get("collectives"):
        L.append("One MPI all-reduce (MPICH's own algorithm, float32 sum) through each cap against the model's ring "
                 "all-reduce on the shared link, 2 (P - 1) / P * n * P / bandwidth + 2 (P - 1) * latency, from the "
                 "calibration above:\n")
        L.append("| cap | P | buffer per rank | measured | model | error | qdisc >= payload |")
        L.append("|---|---:|---:|---:|---:|---:|:---:|")
        for c in res["collectives"]:
            L.append(f"| {CAP_LABEL.get(c['rate'], c['rate'])} | {c['P']} | {_bytes(c['buffer_bytes'])} | "
                     f"{_fmt_s(c['measured_s'])} | {_fmt_s(c['predicted_s'])} | {100 * c['error']:+.1f}% | "
                     f"{'yes' if c['qdisc_ok'] else '**NO**'} |")
        L.append("")
    L.append("## Measured time per step\n")
    L.append("| cap | method | P | time/step (median) | samples/s | mean samples/s | bytes/step/rank | all ranks sent "
             "| qdisc counted | qdisc >= sent | busy |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|")
    for rate in res["caps"]:
        for method in METHODS:
            for r in sorted((r for r in res["runs"] if r["method"] == method and r["rate"] == rate),
                            key=lambda r: r["P"]):
                L.append(f"| {CAP_LABEL.get(rate, rate)} | {method} | {r['P']} | {_fmt_s(r['step_s'])} | "
                         f"{r['samples_per_s']:,.1f} | {r.get('mean_samples_per_s', r['samples_per_s']):,.1f} | "
                         f"{_bytes(r['bytes_per_step'])} | {_bytes(r['sent_bytes'])} | "
                         f"{_bytes(r['qdisc_bytes'])} | {'yes' if r['qdisc_ok'] else '**NO**'} | "
                         + (f"{100 * r['busy_before']:.0f}%" if "busy_before" in r else "-") + " |")
    L.append("")
    byP = {}
    for r in res["runs"]:
        if r["rate"] == res["caps"][-1]:
            byP.setdefault(r["P"], {})[r["method"]] = r
    rows = [(P, v["dslide"], v["data-parallel"]) for P, v in sorted(byP.items())
            if P > 1 and "dslide" in v and "data-parallel" in v]
    if rows:
        L.append(f"At {CAP_LABEL.get(res['caps'][-1], res['caps'][-1])}: " + "; ".join(
            f"P = {P}: dslide {d['samples_per_s']:,.0f} samples/s vs data parallel {p['samples_per_s']:,.1f} "
            f"({d['samples_per_s'] / p['samples_per_s']:,.0f}x), "
            f"{p['bytes_per_step'] / max(1.0, d['bytes_per_step']):,.0f}x fewer bytes per step"
            for P, d, p in rows) + ".\n")
    L.append("Bytes per step per rank predicted by `scripts/_costmodel.py` (same accounting as `dslide.comm`): " + ", ".join(
        f"P = {P}: dslide {_bytes(C.dslide_bytes_per_step(P, BATCH, HIDDEN, ITEMSIZE))}, "
        f"data parallel {_bytes(C.data_parallel_bytes_per_step(P, res['model_bytes']))}" for P in (2, 4)) + ".\n")
    L.append("## Cost model against the measurements\n")
    L.append("Compute per step fitted from the unlimited run at the same P (measured time minus the model's "
             "communication on the unlimited link); communication predicted from the calibrated bandwidth and "
             "latency of each cap.\n")
    L.append("| cap | method | P | measured | predicted (compute + comm) | error |")
    L.append("|---|---|---:|---:|---:|---:|")
    for c in an["checks"]:
        L.append(f"| {CAP_LABEL.get(c['rate'], c['rate'])} | {c['method']} | {c['P']} | {_fmt_s(c['measured_s'])} | "
                 f"{_fmt_s(c['predicted_s'])} ({_fmt_s(c['compute_s'])} + {_fmt_s(c['comm_s'])}) | "
                 f"{100 * c['error']:+.1f}% |")
    if an["checks"]:
        errs = [abs(c["error"]) for c in an["checks"]]
        L.append(f"\nMean absolute error {100 * sum(errs) / len(errs):.1f}%, largest {100 * max(errs):.1f}%.\n")
    if an["scaling"]:
        f = an["fits"]
        L.append("## Predicted scaling to 64 nodes (switched network: every node its own link)\n")
        L.append(f"Compute: dslide {_fmt_s(f['dslide']['compute_split_s'])} / P + "
                 f"{_fmt_s(f['dslide']['compute_fixed_s'])} (fitted from its unlimited runs at P = 1 and 2, one core "
                 f"per rank); data parallel {_fmt_s(f['data-parallel']['compute_split_s'])} / P (its P = 1 time "
                 f"divided by P: this flatters the baseline, whose every replica also updates the whole model). Latency {res['latency_us']:g} us per message "
                 f"(TCP over Ethernet). Model bytes {_bytes(res['model_bytes'])}.\n")
        for name, rows in an["scaling"].items():
            L.append(f"**{name} per node**\n")
            L.append("| P | dslide time/step | dslide samples/s | dslide comm | data-parallel time/step | "
                     "data-parallel samples/s | data-parallel comm | dslide speed-up |")
            L.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in rows:
                L.append(f"| {r['P']} | {_fmt_s(r['dslide_s'])} | {r['dslide_samples_per_s']:,.0f} | "
                         f"{_fmt_s(r['dslide_comm_s'])} | {_fmt_s(r['dp_s'])} | {r['dp_samples_per_s']:,.1f} | "
                         f"{_fmt_s(r['dp_comm_s'])} | {r['speedup']:,.0f}x |")
            L.append("")
    L.append("Reproduce: `sudo .venv/bin/python -m scripts.bench_slownet` (root for the namespaces); "
             "`--replot docs/slownet.json` rebuilds this page and the plot from the saved numbers.\n")
    return "\n".join(L)


def plot(res: dict, an: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("no plot: matplotlib is not installed (an optional extra: .venv/bin/pip install matplotlib, "
            "then --replot docs/slownet.json)")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    ax = axes[0]
    links = res["calibration"]
    caps = [c for c in res["caps"]]
    x_of = {c: links[c]["bandwidth"] * 8 / 1e6 for c in caps}
    colors = {"dslide": "tab:blue", "data-parallel": "tab:red"}
    markers = {2: "o", 4: "s"}
    for method in METHODS:
        for P in (2, 4):
            pts = sorted((x_of[r["rate"]], r["step_s"]) for r in res["runs"]
                         if r["method"] == method and r["P"] == P and r["rate"] in x_of)
            if pts:
                ax.plot(*zip(*pts), marker=markers[P], color=colors[method], linestyle="-",
                        label=f"{method} P={P} measured")
            checks = [c for c in an["checks"] if c["method"] == method and c["P"] == P]
            base = next((r for r in res["runs"] if r["method"] == method and r["P"] == P and r["rate"] == "none"), None)
            if checks and base is not None:
                compute = checks[0]["compute_s"]
                lo = min(x_of.values()) / 2
                hi = max(x_of.values())
                xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
                ys = [compute + comm_time(method, P, {"bandwidth": x * 1e6 / 8, "latency": links["none"]["latency"]},
                                          res["model_bytes"]) for x in xs]
                ax.plot(xs, ys, color=colors[method], linestyle=":" if P == 2 else "--", linewidth=1,
                        label=f"{method} P={P} model")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link payload bandwidth, Mbit/s (shared by all ranks; calibrated)")
    ax.set_ylabel("time per step, s")
    ax.set_title("Measured on one machine (capped loopback)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    styles = {"10 Gbit/s": "-", "1 Gbit/s": "--", "100 Mbit/s": ":"}
    for name, rows in an["scaling"].items():
        Ps = [r["P"] for r in rows]
        ax.plot(Ps, [r["dslide_samples_per_s"] for r in rows], color=colors["dslide"], linestyle=styles.get(name, "-"),
                marker="o", markersize=3, label=f"dslide, {name}")
        ax.plot(Ps, [r["dp_samples_per_s"] for r in rows], color=colors["data-parallel"],
                linestyle=styles.get(name, "-"), marker="s", markersize=3, label=f"data parallel, {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes P (switched links, one per node)")
    ax.set_ylabel("samples/s (predicted)")
    ax.set_title(f"Predicted scaling (cost model, latency {res['latency_us']:g} us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(res: dict, out_dir: Path) -> None:
    an = analyse(res)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "slownet.json").write_text(json.dumps({"results": res, "analysis": an}, indent=1) + "\n")
    md = markdown(res, an)
    (out_dir / "slownet.md").write_text(md)
    made = plot(res, an, out_dir / "slownet.png")
    print(md)
    say(f"wrote {out_dir / 'slownet.md'}, {out_dir / 'slownet.json'}" + (f", {out_dir / 'slownet.png'}" if made else ""))


# -- main ------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--caps", default="none,1gbit,100mbit", help="slownet.sh rates; 'none' (unlimited) is needed for the fit")
    ap.add_argument("--P", default="2,4", help="rank counts (P = 1 is added at the unlimited cap)")
    ap.add_argument("--points", type=int, default=5120, help="training points of the Amazon-like data")
    ap.add_argument("--dslide-steps", type=int, default=20, help="steps per dslide run (the first is left out)")
    ap.add_argument("--dp-steps", type=int, default=3, help="steps per data-parallel run (the first is left out)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per point at the unlimited cap and for dslide (best kept)")
    ap.add_argument("--dp-capped-repeats", type=int, default=1,
                    help="runs per capped data-parallel point (minutes each at 100mbit)")
    ap.add_argument("--latency-us", type=float, default=50.0, help="per-message latency of the predicted cluster")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench_slownet"), help="data, run directories and logs")
    ap.add_argument("--out-dir", default=str(ROOT / "docs"))
    ap.add_argument("--replot", default="", help="only rebuild the outputs from a saved slownet.json")
    ap.add_argument("--resume", action="store_true",
                    help="keep the calibration and the runs already in WORK/partial.json (same settings), do the rest")
    ap.add_argument("--no-yield", action="store_true",
                    help="let waiting ranks spin (default: slownet.sh --yield, they sleep between polls)")
    ap.add_argument("--quiet-wait", type=float, default=300.0,
                    help="before each run, wait up to this many seconds for other work to leave the cores idle")
    args = ap.parse_args(argv)
    OPTS["yield"] = not args.no_yield
    OPTS["quiet_wait_s"] = args.quiet_wait

    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        write_outputs(saved["results"], Path(args.out_dir))
        return 0

    caps = [c.strip() for c in args.caps.split(",") if c.strip()]
    for c in caps:
        rate_bits(c)
    if "none" not in caps:
        raise SystemExit(f"--caps {args.caps!r} must include none (the unlimited runs the model is fitted on)")
    caps.sort(key=lambda c: -rate_bits(c))
    Ps = sorted({int(p) for p in args.P.split(",")})
    if any(p < 2 for p in Ps):
        raise SystemExit(f"--P {args.P!r}: give rank counts >= 2 (P = 1 is always run)")
    for name in ("points", "dslide_steps", "dp_steps", "repeats", "dp_capped_repeats"):
        if getattr(args, name) < (2 if name.endswith("steps") else 1):
            raise SystemExit(f"--{name.replace('_', '-')} = {getattr(args, name)} is too small "
                             f"(steps >= 2: the first is left out; others >= 1)")
    if os.geteuid() != 0:
        raise SystemExit("bench_slownet needs root (scripts/slownet.sh makes network namespaces); run it with sudo")

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"amazon-like-{args.points}"
    if not Path(f"{data}_train.txt").exists():
        say(f"generating Amazon-like data ({args.points:,} points) into {data}_*.txt")
        subprocess.run([PY, "-m", "dslide", "data", "gen", "--preset", "amazon-like", "--points", str(args.points),
                        "--test-points", "64", "--out", str(data)], check=True, env=run_env())
    with open(f"{data}_train.txt") as f:
        n_points, n_features, n_labels = map(int, f.readline().split())

    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "cores": os.cpu_count(),
           "points": n_points, "n_features": n_features, "n_labels": n_labels,
           "model_bytes": model_bytes_of(n_features, n_labels), "caps": caps, "Ps": Ps,
           "steps": {"dslide": args.dslide_steps, "data-parallel": args.dp_steps}, "repeats": args.repeats,
           "latency_us": args.latency_us, "yield": OPTS["yield"],
           "dp_capped_repeats": args.dp_capped_repeats, "quiet_wait_s": args.quiet_wait, "calibration": {}, "runs": []}

    done = {}
    partial = work / "partial.json"
    if args.resume and partial.exists():
        old = json.loads(partial.read_text())
        same = ("points", "caps", "Ps", "steps", "repeats", "dp_capped_repeats", "yield")
        diff = [k for k in same if old.get(k) != res[k]]
        if diff:
            raise SystemExit(f"--resume: {partial} was made with other settings ({', '.join(diff)}); "
                             f"rerun without --resume or with the same settings")
        res.update({k: old[k] for k in ("date", "calibration", "netem", "collectives") if k in old})
        for r in old["runs"]:
            # rebuilt from the run directories (the record's own numbers may predate a fix)
            reps = args.repeats if (r["method"] == "dslide" or r["rate"] == "none") else args.dp_capped_repeats
            recs = []
            for tag in tags_of(r["method"], r["P"], r["rate"], reps):
                try:
                    recs.append(run_record(r["method"], r["P"], r["rate"], work, tag))
                except (OSError, RuntimeError, KeyError, ValueError) as e:
                    say(f"  resume: {tag} not usable ({e}); its point will be run again")
                    recs = []
                    break
            if recs:
                best = min(recs, key=lambda x: x["step_s"])
                if abs(best["step_s"] - r["step_s"]) < 1e-9:  # the same run: keep what only the record has
                    best.update({k: r[k] for k in ("busy_before", "run_wall_s") if k in r and k not in best})
                done[(r["method"], r["P"], r["rate"])] = best
        say(f"resuming: calibration and {len(done)} run(s) from {partial} and {work / 'runs'}")
    if not res["calibration"]:
        say("calibrating the caps")
        for rate in caps:
            res["calibration"][rate] = calibrate(rate, work, max(args.repeats, 3))
        res["netem"] = any(c["netem"] for c in res["calibration"].values())
    if "collectives" not in res:
        say("checking the all-reduce model at each cap")
        res["collectives"] = [collective_check(rate, P, res["calibration"][rate], work, min(2, args.repeats))
                              for rate in caps if rate != "none" for P in Ps]
    partial.write_text(json.dumps(res, indent=1))

    say("training runs")
    for rate in caps:
        for method in METHODS:
            for P in ([1] if rate == "none" else []) + Ps:
                steps = args.dslide_steps if method == "dslide" else args.dp_steps
                reps = args.repeats if (method == "dslide" or rate == "none") else args.dp_capped_repeats
                if (method, P, rate) in done:
                    res["runs"].append(done[(method, P, rate)])
                    continue
                res["runs"].append(train_run(method, P, rate, data, steps, n_points, work, reps))
                # keep what we have: a long benchmark should not lose finished runs (--resume)
                partial.write_text(json.dumps(res, indent=1))
    write_outputs(res, Path(args.out_dir))
    bad = [r for r in res["runs"] if not r["qdisc_ok"]]
    if bad:
        say(f"WARNING: the qdisc counted fewer bytes than sent in {len(bad)} run(s): traffic bypassed the cap")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
