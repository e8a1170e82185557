"""Run one training case in its own process: what most benchmarks of this package are made of.

A case is a JSON dict: data (a preset name with sizes, or file paths), the
configuration, threads, ranks, a training time budget. Each case runs in a
fresh process (under mpiexec when ranks > 1) so that peak memory is its own
and one case's threads never compete with another's; cases run one after the
other, never two at once. Threads, the child's command line and the peak
memory come from scripts/measure.py.

    python -m scripts._bench child case.json     (what run_case launches)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from . import measure as M


def run_case(case: dict, timeout: float = 7200) -> dict:
    """Run `case` in a child process; returns its result dict (with 'error' on failure).

    Besides what the child reports, "tree_peak_mb": the peak memory of the child's whole process
    tree as this process saw it (measure.run: its largest process and the sum over processes)."""
    ranks = int(case.get("ranks", 1))
    env = M.thread_env(int(case.get("threads", 1)))
    # the case goes in a file, not stdin: mpiexec forwards stdin to rank 0 only
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="dslide-case-") as f:
        json.dump(case, f)
        f.flush()
        p, peak = M.run(M.module_cmd("_bench", "child", f.name, ranks=ranks), env=env, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1], "case": case}
    result = json.loads(lines[-1][len("RESULT "):])
    result["tree_peak_mb"] = {"largest": peak.largest_mb, "total": peak.total_mb, "processes": peak.processes}
    return result


def run_cases(cases: list[dict], failures: list[str] | None = None) -> list[dict]:
    """Run each case in turn (see run_case), reporting on stderr; the results of those that ran.

    A case's "label" (default: its name) is what the report and `failures` call it."""
    rows = []
    for case in cases:
        label = case.get("label", case["name"])
        print(f"running: {label} ...", file=sys.stderr, flush=True)
        r = run_case(case)
        if "error" in r:
            print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
            if failures is not None:
                failures.append(f"{label} failed: {r['error']}")
            continue
        r["name"] = case["name"]
        rows.append(r)
        print(f"  {r['samples_per_s']:,.0f} samples/s, P@1 {r['p@1']:.4f}, {r['bytes_per_step']:,.0f} B/step",
              file=sys.stderr, flush=True)
    return rows


def load_data(spec: dict):
    """(train, test) XMCData from {"preset", "n_train", "n_test", "seed", other preset fields such as
    "n_labels"} or {"train", "test"} paths."""
    if "preset" in spec:
        from dslide.datasets.suite import family_of

        overrides = {k: v for k, v in spec.items() if k not in ("preset", "n_train", "n_test", "seed")}
        family = family_of(spec["preset"])  # synthetic, baskets or amazon670k
        return family.generate_split(spec["preset"], n_train=spec.get("n_train"), n_test=spec.get("n_test"),
                                     seed=spec.get("seed", 0), **overrides)
    from dslide.io.data import read_xmc

    return read_xmc(spec["train"]), read_xmc(spec["test"])


def validation_size(config, train) -> int:
    """The points `train.fit` holds out of `train` with the resolved `config`: its validation
    split where it draws one (early stopping, or a fusion to choose), as fit does; else 0."""
    from dslide.train import validation
    from dslide.train.infer_build import fusion_pending

    return validation.validation_size(train.n_points) if (config.early_stop or fusion_pending(config, train)) else 0


def steps_per_epoch(config, train) -> int:
    """Steps of one epoch of `train.fit` on `train`: over the points it trains on."""
    return -(-(train.n_points - validation_size(config, train)) // config.batch_size)


#: the seconds `train.fit` spends training outside the steps' clock, as it records them in
#: Model.index_info: the validation probe, early stopping's end with the prior shift's choice,
#: the neighbour store and the hidden neighbours with their choices
OUTSIDE_STEPS = ("probe_s", "finish_s", "neighbours_s", "hidden_s")


def train_outside_steps(info: dict) -> float:
    """Seconds of training outside the steps' clock (OUTSIDE_STEPS) in a model's index_info."""
    return sum(float(info.get(k) or 0.0) for k in OUTSIDE_STEPS)


class Curve:
    """A run's test scores at given epochs, taken at the logging points of `fit` (outside its clock).

    At each point the network alone is scored on every test point; where the end of training would
    fuse the neighbours' labels, the neighbour store and the hidden neighbours are also built there
    as the end of training builds them (their settings chosen on the validation split), the fused
    model is scored, and they are dropped again (training goes on without them). A point's `train_s` is the training
    time to it plus that build and the validation probe's (built once, before training), as a
    run ending there would count it, but for early stopping's end and the prior shift's choice,
    which only the last point makes (its `finish_s`). A point at the run's last
    step (`last_step`) is not built or fused here: the end of training builds the model's own
    store, and `finish` gives that point the final model's scores and time. Every rank calls
    `at_log` at the same logging points (the scoring and the build are collective)."""

    def __init__(self, epochs, config, train, test, inv_prop, comm, last_step: int | None = None):
        import scipy.sparse as sp

        from dslide.infer.approx import Bound
        from dslide.train import validation
        from dslide.train.infer_build import fusion_counts, fusion_pending

        self.todo = sorted(float(e) for e in epochs)
        self.last_step = last_step
        self.train, self.test, self.truth, self.inv_prop = train, test, sp.csr_matrix(test.Y), inv_prop
        self.points = []
        self.split = self.probe = None
        self.probe_s = 0.0
        if fusion_pending(config, train):
            # the same split and probe as fit's (functions of the data and the seed): built once here
            fit_data, val, _ = validation.split(train, config.seed)
            t0 = time.perf_counter()
            self.probe = validation.FusionProbe.build(fit_data, val, fusion_counts(config), config.proto_weight != 0,
                                                      config.proto_candidates, comm, Bound.of(config))
            self.probe_s = time.perf_counter() - t0
            self.split = fit_data, val

    def _scores(self, ids) -> dict:
        from dslide.metrics import evaluate

        m = evaluate(self.truth, ids, k=5, inv_prop=self.inv_prop)
        return {k: float(m[k]) for k in ("p@1", "p@5", "psp@5") if k in m}

    def at_log(self, model, record: dict) -> None:
        """A point when `record` (a history record) has reached the next epoch asked for."""
        if not self.todo or record["epoch"] < self.todo[0] - 1e-9:
            return
        while self.todo and record["epoch"] >= self.todo[0] - 1e-9:
            self.todo.pop(0)
        from dslide.train.infer_build import build_hidden_neighbours, build_neighbours
        from dslide.infer.predict import predict_topk_scores

        point = {"epoch": record["epoch"], "step": record["step"], "wall_s": record["wall_s"],
                 "network": self._scores(predict_topk_scores(model, self.test.X, 5, fused=False)[0])}
        if record["step"] == self.last_step:
            point["pending"] = True  # the end of training's store: see finish
            self.points.append(point)
            return
        build_s, fused = 0.0, None
        if self.split is not None:
            fit_data, val = self.split
            t0 = time.perf_counter()
            base = build_neighbours(model, self.train, val=val, fit_data=fit_data, probe=self.probe)
            build_hidden_neighbours(model, self.train, val=val, fit_data=fit_data, base=base)
            build_s = time.perf_counter() - t0
            point["fusion"] = model.index_info.get("fusion_choice", {}).get("chosen")
            point["hidden"] = model.index_info.get("hidden_choice", {}).get("chosen")
            if model.neighbours is not None or model.hidden_neighbours is not None:
                fused = self._scores(predict_topk_scores(model, self.test.X, 5)[0])
            model.neighbours = model.hidden_neighbours = None
        point.update(fused or point["network"], neighbours_s=build_s,
                     train_s=record["wall_s"] + build_s + self.probe_s)
        self.points.append(point)

    def finish(self, model, scores: dict) -> None:
        """Give the point left pending at the last step the final model's `scores` (P@k on the
        test points, as `at_log` takes them) and its training time, the store's build and the
        end of training's choices included (the run's `train_s`)."""
        info = model.index_info
        for point in self.points:
            if point.pop("pending", False):
                build_s = info.get("neighbours_s", 0.0) + info.get("hidden_s", 0.0)
                point.update({k: scores[k] for k in ("p@1", "p@5", "psp@5") if k in scores},
                             fusion=info.get("fusion_choice", {}).get("chosen"),
                             hidden=info.get("hidden_choice", {}).get("chosen"), neighbours_s=build_s,
                             train_s=point["wall_s"] + build_s + info.get("finish_s", 0.0) + self.probe_s)


def child(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    import dslide  # noqa: F401  (first: it sets the thread variables OpenBLAS reads when numpy loads it)
    import numpy as np
    import scipy.sparse as sp

    from dslide import train as T
    from dslide.infer.predict import predict_topk
    from dslide.comm import Comm
    from dslide.config import Config, resolve_shape
    from dslide.io.data import XMCData
    from dslide.metrics import evaluate, inverse_propensity

    comm = Comm.world()
    train, test = load_data(case["data"])
    cfg = dict(case.get("config", {}))
    if isinstance(cfg.get("lsh"), dict):
        cfg["lsh"] = dict(cfg["lsh"])
    if "hidden" in cfg:
        cfg["hidden"] = tuple(cfg["hidden"])
    config = Config.from_dict({**cfg, "threads": int(case.get("threads", 1))}).resolve(
        *resolve_shape(train))  # as T.fit resolves it
    # compile the kernels on a few points first: the timings below are of training, not of numba
    warm = XMCData(train.X[:300], train.Y[:300])
    warm_model, _ = T.fit(warm, config.replace(epochs=1.0, eval_every=0, checkpoint_every=0), comm=comm, index=False)
    predict_topk(warm_model, warm.X[:64], 5, exact=True)  # the scoring of the epoch checks, too
    budget = case.get("time_budget")
    clock = {"train_s": 0.0, "since": None}  # training time: evaluations left out, as in the history
    inv_prop = inverse_propensity(train.Y) if train.n_points >= 3 else None
    curve = None
    if case.get("curve_epochs"):
        # a logging point at every epoch's end: the curve's points are taken there, outside the clock
        config = config.replace(log_every=steps_per_epoch(config, train))
        curve = Curve(case["curve_epochs"], config, train, test, inv_prop, comm,
                      last_step=T.total_steps(config, train.n_points - validation_size(config, train)))

    def callback(event, model, info):
        if event == "log":
            if curve is not None:
                curve.at_log(model, info)
            clock["train_s"], clock["since"] = info["wall_s"], time.perf_counter()
            return None
        now = time.perf_counter()
        if clock["since"] is None:
            clock["since"] = now
        if not budget:
            return None
        over = clock["train_s"] + (now - clock["since"]) > budget
        # every rank must stop at the same step: the slowest clock decides
        return "stop" if comm.allreduce_max(float(over)) > 0 else None

    # the inference index (built after training, outside its time) only where --lsh is measured
    lsh = bool(case.get("inference") or case.get("lsh_predict"))
    model, history = T.fit(train, config, test, comm=comm, callback=callback, index=lsh)
    predict_topk(model, test.X[:64], 5, exact=True)  # compile outside the timing
    t0 = time.perf_counter()
    pred = predict_topk(model, test.X, 5, exact=True)
    predict_s = time.perf_counter() - t0
    # PSP@k with the training labels' propensities (pyxclib's A, B), as `dslide train` reports it
    final = evaluate(sp.csr_matrix(test.Y), pred, k=5, inv_prop=inv_prop)
    net = model.network
    steps = history[-1]["step"]
    sent = comm.allreduce_sum(np.array([float(sum(r["bytes_per_step"] * (r["step"] - (history[i - 1]["step"] if i else 0))
                                                  for i, r in enumerate(history)))]))[0]
    result = {
        "name": case.get("name", ""),
        "ranks": comm.size, "threads": config.threads or int(case.get("threads", 1)),
        "data": {"n_train": train.n_points, "n_test": test.n_points, "n_features": train.n_features,
                 "n_labels": train.n_labels},
        "kinds": [l.kind for l in net.layers],
        "config": {k: v for k, v in config.to_dict(flat=True).items() if k != "lsh_layers"},
        "steps": steps, "epochs": history[-1]["epoch"],
        # training includes what fit does outside the steps' clock (`train_outside_steps`); the
        # inference index, built after it where --lsh is measured, is index_s
        "train_s": sum(r["wall_s_delta"] for r in history) + train_outside_steps(model.index_info),
        "index_s": model.index_info.get("index_s") if lsh else None,
        "samples_per_s": T.throughput(history, config.batch_size),
        "p@1": final["p@1"], "p@3": final["p@3"], "p@5": final["p@5"],
        **{f"psp@{k}": final[f"psp@{k}"] for k in (1, 3, 5) if f"psp@{k}" in final},
        "predict_s": predict_s,
        "bytes_per_step": sent / comm.size / max(1, steps),
        "bytes_per_step_data_parallel": T.data_parallel_bytes(net, comm.size),
        # each rank's own peak (VmHWM), the largest: not T.peak_rss_mb, whose ru_maxrss includes the
        # size of the benchmark process that started this one
        "peak_rss_mb": max(comm.allgather_object(M.peak_rss_mb() or 0.0)),
        "timers_s": {k: round(v, 2) for k, v in net.timers.items()},
        "curve": [{"wall_s": r["wall_s"], "step": r["step"], "p@1": r["p@1"]} for r in history if "p@1" in r],
    }
    if curve is not None:
        curve.finish(model, final)
        result["curve_points"], result["probe_s"] = curve.points, curve.probe_s
        result["probe_search"] = curve.probe.search.get("search") if curve.probe is not None else None
    result["fusion_choice"] = model.index_info.get("fusion_choice", {}).get("chosen")
    result["hidden_choice"] = model.index_info.get("hidden_choice", {}).get("chosen")
    result["hidden_s"] = model.index_info.get("hidden_s", 0.0)
    if case.get("lsh_predict") and model.index is not None:
        predict_topk(model, test.X[:64], 5, exact=False)
        t0 = time.perf_counter()
        ids = predict_topk(model, test.X, 5, exact=False)
        result["lsh_predict_s"] = time.perf_counter() - t0
        m = evaluate(sp.csr_matrix(test.Y), ids, k=5, inv_prop=inv_prop)
        result["lsh"] = {k: m[k] for k in ("p@1", "p@5", "psp@5") if k in m}
    out = net.layers[-1]
    if out.kind == "lsh":
        # the whole layer's block: each rank's mean summed over ranks
        mean = out.block_mean()
        result["block"] = {k: float(comm.allreduce_sum(np.array([v]))[0]) for k, v in mean.items()}
        result["lsh_upkeep_s"] = out.upkeep_s
    if case.get("inference"):
        from ._lsh_eval import compare_inference

        result["index"] = model.index_info
        result["inference"] = compare_inference(model, test, inv_prop)
    if case.get("save"):
        # the trained model, weights and index only, as `dslide export` writes it (for later measurements)
        from dslide import propensity
        from dslide.io import checkpoint as ck

        ck.save(net, Path(case["save"]), comm, weights_only=True)
        if comm.rank == 0:
            propensity.save(case["save"], propensity.compute(train.Y))
        result["saved"] = case["save"]
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(0 if sys.argv[1:] in ([], ["--help"], ["-h"]) else 2)
