"""The PyTorch reference: dslide's network as a dense full-softmax PyTorch model on the CPU.

Runs inside `.venv-baselines` (set up by `scripts/_baselines.py`) as
`python -m scripts._torch_train` from the repository root, and imports only
torch, numpy, the standard library and scripts/measure.py (standard library
only), so that venv needs nothing else.

The network, with dslide's conventions:

    x   = row of X scaled to unit L2 norm               (sparse, [n_features])
    h   = dropout(relu(x W1 + b1))                      W1 [n_features, hidden], b1 [hidden]
    z   = h W2^T + b2                                   W2 [n_labels, hidden],   b2 [n_labels]
    loss = -(1/B) sum_i sum_{l in labels(i)} log softmax(z_i)_l / |labels(i)|

(a point without labels adds 0 to the loss and sends no gradient). W1 starts
U(-s, s) with s = --init-input-scale (dslide's first-layer rule for L2-normalised
inputs), W2 Glorot-uniform U(-sqrt(6/(hidden+n_labels)), +...), both biases 0
as in dslide. The first layer is an `nn.EmbeddingBag(mode="sum")` fed the
batch's feature ids with their values as `per_sample_weights` (or, with
`--first-layer sparse_mm`, `torch.sparse.mm` of the batch's CSR rows), the
output an `nn.Linear`; `torch.optim.Adam(fused=True)` over every parameter
with dense gradients.

Why these choices (measured on this 2-core machine, batch 256, hidden 128,
best of repeated runs on a shared machine):
* EmbeddingBag over sparse.mm: first layer forward + backward 28 ms vs 72 ms
  at 135,909 features, 4 ms vs 21 ms at 50,000 (1 thread); whole steps on the
  `small` preset (50,000 features, 20,000 labels), 1 thread: 4,400 vs 4,200
  samples/s.
* Adam's fused implementation: the optimiser step over the 670,091-label model
  took 0.12-0.2 s fused against 0.7-1.1 s for torch's default (single-tensor)
  and foreach ones (2 threads); on `small`, 1 thread, 4,400 vs 2,830 samples/s.
  The same arithmetic: identical P@k in these runs, and the tests check both
  against numpy.
* Dense Adam for the first layer, not sparse gradients with SparseAdam: the
  latter's step was no faster (43-66 ms vs 20 ms at 135,909 features; 10 ms vs
  7 ms at 50,000, where its cheaper backward about evens out) and it is a
  lazy Adam, a different optimiser.
* Log-softmax gathered at the labels, not `F.cross_entropy` with a dense
  target of class probabilities: that made steps 2-3x slower at 670,091 labels.

With `--output sampled` the output layer is a sampled softmax, as a careful
PyTorch user writes one for a very wide output, built like dslide's shared
block (see dslide/model/network.py LSHLayer, without the LSH candidates):

    C    = the batch's labels (sorted) + S negatives drawn uniformly without
           replacement from all labels, those among the batch's labels dropped
    z_iC = h_i W2[C]^T + b2[C] + corr,  corr = 0 for the batch's labels,
           log((n_labels - |labels|) / |negatives|) for a negative (log-Q: each
           stands for that many labels outside the batch's)
    loss = the loss above over the columns C

with S = --negatives drawn by `numpy.random.default_rng([seed, 0x4E6, step])
.choice(n_labels, S, replace=False)` (dslide's count: 16,384 at 670,091
labels). W2 and b2 are `nn.Embedding(sparse=True)` tables gathered at C, the
first layer an `nn.EmbeddingBag(sparse=True)`: `torch.optim.SparseAdam` updates
the rows that got gradient (a lazy Adam, as dslide's), `Adam` the dense b1.
Evaluation scores every label (h W2^T + b2), as for the full softmax.
`--lr-schedule linear` decays the learning rate linearly to 0 over the run's
steps (dslide's default: lr (1 - (t - 1) / T) at step t of T);
`--output-bias log_prior` starts b2 at log((count + 1) / (n + n_labels)) from
the training labels (dslide's default).

The sample order of epoch e is
`numpy.random.default_rng([seed, 0x5EED, e]).permutation(n)`, dslide's order,
cut into batches of --batch-size (the last batch of an epoch may be smaller);
the run has round(epochs * ceil(n / batch_size)) steps, or fewer when
--time-budget seconds of training time run out first.

Input files: one `.npz` per split (`np.savez`): indptr, indices, data (the
features, CSR, float32 values), y_indptr, y_indices (the labels, CSR pattern)
and shape = (n_points, n_features, n_labels).

Output: --log FILE.jsonl, one record per logging point (every --log-every and
--eval-every steps and at the end): step, epoch, samples, wall_s (training time,
evaluation excluded), loss (mean over the steps since the previous record) and,
at evaluation points, p@1/p@3/p@5 on the first --eval-points test points
(exact top 5 over all labels). The last stdout line is a JSON summary:
samples_per_s (samples / training time with the first 3 steps left out as
warm-up; all steps when there are 3 or fewer), the final p@k, peak RSS, the
torch version and thread count.

--save-topk F.npy writes the final exact top 5 of every test point (int64
[n_test, 5]), for metrics computed outside this venv.

--load-init F.npz starts from given weights (W1 [n_features, hidden], b1,
W2 [n_labels, hidden], b2), --save-init / --save-final write them, so a test
can replay a step in plain numpy.
"""

import argparse
import json
import time

import numpy as np
import torch

from .measure import peak_rss_mb  # the standard library only

WARMUP_STEPS = 3
EVAL_BLOCK_ELEMS = 1 << 24   # logits per evaluation block: 64 MB in float32
FIRST_LAYERS = ("embedding_bag", "sparse_mm")
ADAM_IMPLS = ("default", "foreach", "fused")
OUTPUTS = ("full", "sampled")
NEGATIVES_KEY = 0x4E6    # the negatives' stream: default_rng([seed, NEGATIVES_KEY, step])
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# --------------------------------------------------------------------------- data


class Split:
    """A split's CSR arrays: features L2-normalised in `dtype`, labels as a pattern."""

    def __init__(self, path, dtype):
        with np.load(path) as f:
            self.indptr = f["indptr"].astype(np.int64)
            self.indices = f["indices"].astype(np.int64)
            data = f["data"].astype(np.float64)
            self.y_indptr = f["y_indptr"].astype(np.int64)
            self.y_indices = f["y_indices"].astype(np.int64)
            self.n, self.n_features, self.n_labels = (int(v) for v in f["shape"])
        if self.indptr.shape[0] != self.n + 1 or self.y_indptr.shape[0] != self.n + 1:
            raise ValueError(f"{path}: indptr lengths ({self.indptr.shape[0]}, {self.y_indptr.shape[0]}) "
                             f"do not match n_points + 1 ({self.n + 1})")
        # Norms accumulate in float64 (dslide's differ from these by float32 rounding);
        # an empty row stays empty rather than dividing by zero.
        row = np.repeat(np.arange(self.n), np.diff(self.indptr))
        norms = np.sqrt(np.bincount(row, weights=data * data, minlength=self.n))
        norms[norms == 0] = 1.0
        self.data = (data / norms[row]).astype(dtype)

    def rows(self, ids):
        """CSR of rows `ids`: (offsets int64 [B+1], feature ids int64, values, label offsets, label ids)."""
        xo, xpos = _gather(self.indptr, ids)
        yo, ypos = _gather(self.y_indptr, ids)
        return xo, self.indices[xpos], self.data[xpos], yo, self.y_indices[ypos]


def _gather(indptr, ids):
    """Offsets [len(ids)+1] and positions of the entries of rows `ids` of a CSR, in that order."""
    starts = indptr[ids]
    lens = indptr[ids + 1] - starts
    offsets = np.zeros(ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    pos = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1], dtype=np.int64)
    return offsets, pos


def epoch_order(seed, epoch, n):
    """dslide's sample order of an epoch."""
    return np.random.default_rng([seed, 0x5EED, epoch]).permutation(n)


# --------------------------------------------------------------------------- model


class Net(torch.nn.Module):
    """relu(x W1 + b1) -> dropout -> Linear(hidden, n_labels); see the module docstring."""

    def __init__(self, n_features, hidden, n_labels, dropout, init_input_scale, first_layer, dtype, gen,
                 output="full"):
        super().__init__()
        self.first_layer, self.output = first_layer, output
        sparse = output == "sampled"  # sparse gradients wherever a step touches few rows
        if first_layer == "embedding_bag":
            self.emb = torch.nn.EmbeddingBag(n_features, hidden, mode="sum", dtype=dtype, sparse=sparse)
            w1 = self.emb.weight
        else:
            self.w1 = torch.nn.Parameter(torch.empty(n_features, hidden, dtype=dtype))
            w1 = self.w1
        self.b1 = torch.nn.Parameter(torch.zeros(hidden, dtype=dtype))
        self.drop = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        if sparse:
            self.out_w = torch.nn.Embedding(n_labels, hidden, dtype=dtype, sparse=True)
            self.out_b = torch.nn.Embedding(n_labels, 1, dtype=dtype, sparse=True)
        else:
            self.out = torch.nn.Linear(hidden, n_labels, dtype=dtype)
        a = (6.0 / (hidden + n_labels)) ** 0.5
        with torch.no_grad():
            w1.uniform_(-init_input_scale, init_input_scale, generator=gen)
            self.W2.uniform_(-a, a, generator=gen)
            self.b2.zero_()

    @property
    def W1(self):
        return self.emb.weight if self.first_layer == "embedding_bag" else self.w1

    @property
    def W2(self):
        """The output weights [n_labels, hidden] (a parameter or a view of one)."""
        return self.out_w.weight if self.output == "sampled" else self.out.weight

    @property
    def b2(self):
        """The output biases [n_labels] (a parameter or a view of one)."""
        return self.out_b.weight[:, 0] if self.output == "sampled" else self.out.bias

    def sparse_parameters(self):
        """(parameters with sparse gradients, the others)."""
        sparse = [p for m in self.modules() if getattr(m, "sparse", False) for p in m.parameters(recurse=False)]
        ids = {id(p) for p in sparse}
        return sparse, [p for p in self.parameters() if id(p) not in ids]

    def hidden(self, offsets, feats, vals):
        """relu(x W1 + b1) for the CSR batch (offsets [B+1], feats, vals): [B, hidden]."""
        if self.first_layer == "embedding_bag":
            pre = self.emb(feats, offsets[:-1], per_sample_weights=vals)
        else:
            B = offsets.shape[0] - 1
            X = torch.sparse_csr_tensor(offsets, feats, vals, size=(B, self.W1.shape[0]), check_invariants=False)
            pre = torch.sparse.mm(X, self.w1)
        return torch.relu(pre + self.b1)

    def forward(self, offsets, feats, vals):
        """Logits of every label, [B, n_labels]."""
        h = self.drop(self.hidden(offsets, feats, vals))
        if self.output == "sampled":
            return h @ self.W2.T + self.b2
        return self.out(h)

    def sampled_logits(self, offsets, feats, vals, cand, corr):
        """Logits of the labels `cand` (int64 tensor [C]) plus `corr` ([C]): [B, C], sparse gradients."""
        h = self.drop(self.hidden(offsets, feats, vals))
        return h @ self.out_w(cand).T + self.out_b(cand)[:, 0] + corr

    def weights(self):
        """The parameters as numpy arrays: W1 [F, H], b1 [H], W2 [L, H], b2 [L]."""
        return {"W1": self.W1.detach().numpy().copy(), "b1": self.b1.detach().numpy().copy(),
                "W2": self.W2.detach().numpy().copy(), "b2": self.b2.detach().numpy().copy()}

    def load(self, path):
        with np.load(path) as f:
            arrays = {k: f[k] for k in ("W1", "b1", "W2", "b2")}
        with torch.no_grad():
            for name, p in (("W1", self.W1), ("b1", self.b1), ("W2", self.W2), ("b2", self.b2)):
                if arrays[name].shape != tuple(p.shape):
                    raise ValueError(f"{path}: {name} has shape {arrays[name].shape}, expected {tuple(p.shape)}")
                p.copy_(torch.from_numpy(arrays[name]))


def batch_loss(logits, y_offsets, y_ids):
    """-(1/B) sum_i sum_{l in labels(i)} log softmax(z_i)_l / |labels(i)|, a 0-d tensor.

    Gathering log-probabilities at the labels avoids building a dense [B, n_labels]
    target (686 MB per batch at 670,091 labels), which `F.cross_entropy` with
    class probabilities would need; the gradient is the same, (p - y) / B.
    """
    B = logits.shape[0]
    per = np.diff(y_offsets)
    rows = np.repeat(np.arange(B), per)
    w = torch.from_numpy(1.0 / per[rows]).to(logits.dtype)
    logp = torch.log_softmax(logits, dim=1)
    return -(logp[torch.from_numpy(rows), torch.from_numpy(y_ids)] * w).sum() / B


def sampled_block(y_ids, n_labels, n_neg, seed, step):
    """(C, corr, cols) of a step's sampled softmax (see the module docstring).

    y_ids: the batch's label ids (int64, CSR order). C int64 [P + N']: the P
    sorted distinct batch labels, then the N' negatives (sorted) drawn among the
    other labels; corr float64 [P + N']; cols int64 like y_ids: the position of
    each label in C.
    """
    pos = np.unique(y_ids)
    drawn = np.random.default_rng([seed, NEGATIVES_KEY, step]).choice(n_labels, min(n_neg, n_labels), replace=False)
    neg = np.setdiff1d(drawn, pos)
    corr = np.zeros(pos.shape[0] + neg.shape[0])
    if neg.shape[0]:
        corr[pos.shape[0]:] = np.log((n_labels - pos.shape[0]) / neg.shape[0])
    return np.concatenate([pos, neg]).astype(np.int64), corr, np.searchsorted(pos, y_ids).astype(np.int64)


class LinearDecay:
    """lr (1 - (t - 1) / T) at step t of T (1-based), on every optimiser given; 1 for "constant"."""

    def __init__(self, optimizers, total_steps, kind):
        self.opts, self.T, self.kind = optimizers, total_steps, kind
        self.base = [[g["lr"] for g in o.param_groups] for o in optimizers]

    def set(self, step):
        f = max(0.0, 1.0 - (step - 1) / self.T) if self.kind == "linear" else 1.0
        for o, base in zip(self.opts, self.base):
            for g, lr in zip(o.param_groups, base):
                g["lr"] = lr * f


# --------------------------------------------------------------------------- evaluation


def precision_at(top, y_indptr, y_indices, n_labels, ks=(1, 3, 5)):
    """P@k = hits among the first k predictions / k, mean over points (no labels: 0).

    top: int64 [n, >= max(ks)] best first; the labels are CSR rows (y_indptr [n+1], y_indices).
    """
    n = top.shape[0]
    # A (point, label) pair as one sorted int64 key, looked up with searchsorted.
    keys = np.sort(np.repeat(np.arange(n, dtype=np.int64), np.diff(y_indptr[:n + 1])) * n_labels
                   + y_indices[:y_indptr[n]])
    q = np.arange(n, dtype=np.int64)[:, None] * n_labels + top
    pos = np.minimum(np.searchsorted(keys, q), max(keys.shape[0] - 1, 0))
    hit = (keys[pos] == q) if keys.shape[0] else np.zeros(q.shape, dtype=bool)
    cum = np.cumsum(hit, axis=1)
    return {f"p@{k}": float(np.mean(cum[:, k - 1] / k)) if n else 0.0 for k in ks}


def evaluate(model, test, n_points, k=5, block=0):
    """Exact top-k over all labels for the first `n_points` test points, in blocks; p@1/p@3/p@5.

    block: test points per block (0: as many as keep the logits near 64 MB).
    """
    top = topk(model, test, n_points, k, block)
    return precision_at(top, test.y_indptr, test.y_indices, test.n_labels)


def topk(model, test, n_points, k=5, block=0):
    """int64 [min(n_points, n_test), k]: the k best labels of each test point, best first."""
    n = min(n_points, test.n)
    block = block or max(1, EVAL_BLOCK_ELEMS // max(test.n_labels, 1))
    top = np.empty((n, k), dtype=np.int64)
    model.eval()
    with torch.no_grad():
        for a in range(0, n, block):
            ids = np.arange(a, min(n, a + block))
            xo, xf, xv, _, _ = test.rows(ids)
            z = model(torch.from_numpy(xo), torch.from_numpy(xf), torch.from_numpy(xv))
            top[a:a + ids.shape[0]] = torch.topk(z, k, dim=1).indices.numpy()
    model.train()
    return top


# --------------------------------------------------------------------------- training


def make_optimizer(params, lr, impl):
    kw = {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8}
    if impl == "foreach":
        kw["foreach"] = True
    elif impl == "fused":
        kw["fused"] = True
    return torch.optim.Adam(params, **kw)


def train(args):
    dtype = DTYPES[args.dtype]
    np_dtype = np.float32 if args.dtype == "float32" else np.float64
    torch.set_num_threads(args.threads)
    # Once the logits of a row spread over more than ~87, exp() gives denormal
    # probabilities: measured here, log_softmax forward + backward on [256, 670091]
    # with 17 % of them denormal took 4.4 s unflushed against 0.89 s flushed.
    torch.set_flush_denormal(not args.no_flush_denormal)
    torch.manual_seed(args.seed)          # dropout masks
    gen = torch.Generator().manual_seed(args.seed)

    tr = Split(args.train, np_dtype)
    te = Split(args.test, np_dtype) if args.test else None
    if te is not None and (te.n_features, te.n_labels) != (tr.n_features, tr.n_labels):
        raise ValueError(f"test shape (features, labels) = {(te.n_features, te.n_labels)} differs from "
                         f"train {(tr.n_features, tr.n_labels)}")
    model = Net(tr.n_features, args.hidden, tr.n_labels, args.dropout, args.init_input_scale,
                args.first_layer, dtype, gen, output=args.output)
    if args.output_bias == "log_prior":
        counts = np.bincount(tr.y_indices, minlength=tr.n_labels)
        with torch.no_grad():
            model.b2.copy_(torch.from_numpy(np.log((counts + 1.0) / (tr.n + tr.n_labels))))
    if args.load_init:
        model.load(args.load_init)
    if args.save_init:
        np.savez(args.save_init, **model.weights())
    if args.output == "sampled":
        sparse, dense = model.sparse_parameters()
        opts = [torch.optim.SparseAdam(sparse, lr=args.lr, betas=(0.9, 0.999), eps=1e-8),
                make_optimizer(dense, args.lr, args.adam)]
    else:
        opts = [make_optimizer(model.parameters(), args.lr, args.adam)]

    B = args.batch_size
    steps_per_epoch = max(1, -(-tr.n // B))
    total_steps = max(1, int(round(args.epochs * steps_per_epoch)))
    schedule = LinearDecay(opts, total_steps, args.lr_schedule)  # over the epochs, whatever stops the run
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    log = open(args.log, "w") if args.log else None
    records = []
    train_s = warm_s = 0.0
    samples = warm_samples = 0
    loss_acc, loss_n = 0.0, 0
    step = 0
    for step in range(1, total_steps + 1):
        t0 = time.perf_counter()
        epoch, pos = divmod(step - 1, steps_per_epoch)
        if pos == 0:
            order = epoch_order(args.seed, epoch, tr.n)
        ids = order[pos * B:(pos + 1) * B]
        xo, xf, xv, yo, yi = tr.rows(ids)
        x = (torch.from_numpy(xo), torch.from_numpy(xf), torch.from_numpy(xv))
        if args.output == "sampled":
            cand, corr, cols = sampled_block(yi, tr.n_labels, args.negatives, args.seed, step)
            logits = model.sampled_logits(*x, torch.from_numpy(cand), torch.from_numpy(corr).to(dtype))
            loss = batch_loss(logits, yo, cols)
        else:
            loss = batch_loss(model(*x), yo, yi)
        schedule.set(step)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
        loss_acc += loss.item()
        train_s += time.perf_counter() - t0
        loss_n += 1
        samples += ids.shape[0]
        if step == WARMUP_STEPS:
            warm_s, warm_samples = train_s, samples
        last = step == total_steps or (args.time_budget is not None and train_s >= args.time_budget)
        do_eval = te is not None and args.eval_points > 0 and (
            last or (args.eval_every and step % args.eval_every == 0))
        if last or do_eval or (args.log_every and step % args.log_every == 0):
            rec = {"step": step, "epoch": step / steps_per_epoch, "samples": samples,
                   "wall_s": train_s, "loss": loss_acc / loss_n}
            loss_acc, loss_n = 0.0, 0
            if do_eval:
                t1 = time.perf_counter()
                rec.update(evaluate(model, te, args.eval_points, block=args.eval_block))
                rec["eval_s"] = time.perf_counter() - t1
            records.append(rec)
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
        if last:
            break
    if log:
        log.close()
    if args.save_final:
        np.savez(args.save_final, **model.weights())
    if args.save_topk and te is not None:
        t1 = time.perf_counter()
        np.save(args.save_topk, topk(model, te, te.n, block=args.eval_block))
        predict_s = time.perf_counter() - t1
    else:
        predict_s = None

    warm = step > WARMUP_STEPS
    rate_s = train_s - warm_s if warm else train_s
    rate_n = samples - warm_samples if warm else samples
    final = records[-1]
    return {
        "samples_per_s": rate_n / rate_s if rate_s > 0 else None,
        "warmup_steps_excluded": WARMUP_STEPS if warm else 0,
        "steps": step, "samples": samples, "train_s": train_s,
        "stopped_by": "time_budget" if step < total_steps else "steps",
        "p@1": final.get("p@1"), "p@3": final.get("p@3"), "p@5": final.get("p@5"),
        "eval_points": min(args.eval_points, te.n) if te is not None else 0,
        "final_loss": final["loss"],
        "peak_rss_mb": peak_rss_mb(),
        "torch_version": torch.__version__, "threads": torch.get_num_threads(),
        "dtype": args.dtype, "first_layer": args.first_layer, "adam": args.adam,
        "output": args.output, "negatives": args.negatives if args.output == "sampled" else None,
        "lr_schedule": args.lr_schedule, "output_bias": args.output_bias, "predict_s": predict_s,
        "flush_denormal": not args.no_flush_denormal,
        "shape": [tr.n, tr.n_features, tr.n_labels],
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True, help="train split .npz")
    ap.add_argument("--test", default=None, help="test split .npz (no evaluation without it)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--time-budget", type=float, default=None, help="stop after this much training time (s)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--init-input-scale", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: at the end only)")
    ap.add_argument("--eval-points", type=int, default=2000)
    ap.add_argument("--eval-block", type=int, default=0, help="test points per evaluation block (0: auto)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--log", default=None, help="JSONL log file")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--first-layer", default="embedding_bag", choices=FIRST_LAYERS)
    ap.add_argument("--adam", default="fused", choices=ADAM_IMPLS,
                    help="torch.optim.Adam implementation (default: fused; 'default': torch's own choice)")
    ap.add_argument("--output", default="full", choices=OUTPUTS,
                    help="full softmax, or a sampled softmax over the batch's labels and --negatives")
    ap.add_argument("--negatives", type=int, default=16384, help="shared uniform negatives per step (sampled)")
    ap.add_argument("--lr-schedule", default="constant", choices=("constant", "linear"))
    ap.add_argument("--output-bias", default="zero", choices=("zero", "log_prior"))
    ap.add_argument("--save-topk", default=None, help="write the final top 5 of every test point (.npy)")
    ap.add_argument("--no-flush-denormal", action="store_true",
                    help="leave denormal floats on (only to measure what flushing them saves)")
    ap.add_argument("--load-init", default=None, help="start from the weights in this .npz")
    ap.add_argument("--save-init", default=None, help="write the initial weights to this .npz")
    ap.add_argument("--save-final", default=None, help="write the final weights to this .npz")
    args = ap.parse_args(argv)
    checks = [("hidden", args.hidden >= 1, ">= 1"), ("lr", args.lr > 0, "> 0"),
              ("batch_size", args.batch_size >= 1, ">= 1"), ("epochs", args.epochs > 0, "> 0"),
              ("threads", args.threads >= 1, ">= 1"), ("dropout", 0 <= args.dropout < 1, "in [0, 1)"),
              ("init_input_scale", args.init_input_scale > 0, "> 0"),
              ("eval_every", args.eval_every >= 0, ">= 0"), ("eval_points", args.eval_points >= 0, ">= 0"),
              ("eval_block", args.eval_block >= 0, ">= 0"),
              ("log_every", args.log_every >= 0, ">= 0"), ("max_steps", args.max_steps >= 0, ">= 0"),
              ("time_budget", args.time_budget is None or args.time_budget > 0, "> 0"),
              ("negatives", args.negatives >= 1, ">= 1")]
    for name, ok, valid in checks:
        if not ok:
            ap.error(f"--{name.replace('_', '-')} ({getattr(args, name)}) must be {valid}")
    return args


def main(argv=None):
    result = train(parse_args(argv))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
