"""The Python interface: `dslide.Model`, in the estimator style of napkinXC and PECOS.

    import dslide
    model = dslide.Model(epochs=5, hidden=128)           # the keys of --set
    model.fit(X, Y)                                       # scipy CSR, CSR or label lists
    ids, scores = model.predict(X_test, k=5)              # int64 [n, k], float64 [n, k]; top_k=5 alike
    P = model.predict_csr(X_test, k=5)                    # csr [n, n_labels] of top-k scores, as PECOS
    model.evaluate(X_test, Y_test)                        # {"p@1": ..., "psp@5": ...}
    model.save("runs/mine")                               # the run directory `dslide train` writes
    model = dslide.Model.load("runs/mine")                # also a run directory of `dslide train`

Under `mpiexec -n P python script.py` every rank runs the same script: the
layers are split over the ranks, each rank gets the whole result of
`predict` and `evaluate`, `save` writes every rank's slices, and `load`
splits a saved model over however many ranks load it. No files are written
unless `save` is called.

scikit-learn's conventions: `get_params()` gives the settings as passed to
`Model(...)`, `set_params(**settings)` changes them, so `sklearn.base.clone`
and grid search work (scikit-learn is not needed otherwise). `fit` never
changes them: it resolves the settings left unset from its data into
`config_`, so a second `fit` on other data resolves them again. After `fit`
(or `load`), `n_features_in_` is the number of features.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dslide.session import Progress, check_k, check_lsh, config_toml, load_model, normalise_values, notice_threads

__all__ = ["Model", "labels_matrix"]


def labels_matrix(Y, n_points: int, n_labels: int | None = None) -> sp.csr_matrix:
    """Labels as csr float32 [n_points, n_labels] (ones): Y a scipy sparse indicator matrix
    (its non-zero entries are the labels; stored zeros are none) or a list of n_points label
    lists (ints >= 0, or integral floats; n_labels None: the largest label + 1). Checked by
    dslide.validate: strings, booleans, fractions and ids out of range are refused."""
    from dslide import validate

    if n_labels is not None:
        n_labels = validate.count(n_labels, "n_labels", 1)
    if sp.issparse(Y):
        if Y.shape[0] != n_points:
            raise ValueError(f"Y has {Y.shape[0]} rows but X has {n_points}: give one row of labels per point")
        return validate.labels(Y, "Y", n_labels)
    if isinstance(Y, np.ndarray) and Y.ndim == 2:
        raise ValueError("Y as a dense array is not taken (it would hold every label of every point): "
                         "give a scipy.sparse indicator matrix or a list of label lists")
    return validate.label_lists(Y, n_points, n_labels)


def _features(X, what: str = "X") -> sp.csr_matrix:
    from dslide import validate

    return validate.features(X, what)


def settings_config(settings: dict):
    """A Config from keyword settings: the keys of `--set` (dslide config show), a dotted key
    for a table (`**{"lsh.K": 8}`) or the table as a dict (`lsh={"K": 8}`)."""
    from dslide.config import Config

    values: dict = {}
    for key, v in settings.items():
        if "." in key:
            table, sub = key.split(".", 1)
            values.setdefault(table, {})[sub] = v
        elif isinstance(v, dict) and isinstance(values.get(key), dict):
            values[key].update(v)
        else:
            values[key] = dict(v) if isinstance(v, dict) else v
    return Config.from_dict(normalise_values(values))


class Model:
    """An extreme classifier: a network with an LSH-sparse output layer, split over the MPI ranks.

    Model(**settings): the settings of `dslide train --set` (the same keys, defaults and
    checks; ValueError names a bad value and the valid range). Settings left unset take
    their value from the data in `fit`, as on the command line.

    config: the Config of the settings (unset ones None); config_: the resolved one `fit`
    trained with (or the loaded model's). comm is not a setting: `get_params` leaves it out.
    """

    def __init__(self, *, comm=None, **settings):
        self.config = settings_config(settings)
        self._settings = settings  # as given: get_params returns these very objects (sklearn's clone checks)
        self.comm = _comm(comm)
        self._model = None  # dslide.train.Model once fitted or loaded
        self._props = None  # the training labels' propensities (dslide.propensity), or None
        self.history: list = []

    # -- settings (scikit-learn's estimator interface) -------------------------------

    def get_params(self, deep: bool = True) -> dict:
        """The settings given to `Model(...)` or `set_params`, unchanged by `fit`: {key: value}.
        deep: accepted for scikit-learn (a Model holds no sub-estimators)."""
        return dict(self._settings)

    def set_params(self, **settings) -> "Model":
        """Change settings (the keys of `Model(...)`), checked as there; the fitted model, if
        any, is kept until the next `fit`. Returns self."""
        merged = {**self._settings, **settings}
        self.config = settings_config(merged)
        self._settings = merged
        return self

    def __sklearn_clone__(self) -> "Model":
        # scikit-learn >= 1.3: an unfitted copy on the same communicator (the generic clone
        # would deep-copy settings alike but start on the MPI world)
        import copy

        return type(self)(comm=self.comm, **copy.deepcopy(self._settings))

    # -- training ------------------------------------------------------------------

    def fit(self, X, Y, *, X_val=None, Y_val=None, n_labels: int | None = None, progress: bool = False) -> "Model":
        """Train on X csr [n, n_features] with labels Y (csr indicator [n, n_labels] or n label lists).

        X_val, Y_val: a validation set, scored every `eval_every` steps and at the end (the
        P@k of `history`). n_labels: the output width when Y is label lists (default: the
        largest label + 1). progress: a progress bar on rank 0 (tqdm, on stderr). Returns self.
        """
        from dslide import propensity
        from dslide import train as T
        from dslide.config import resolve_shape
        from dslide.io.data import XMCData

        X = _features(X)
        train = XMCData(X, labels_matrix(Y, X.shape[0], n_labels))
        if train.n_labels == 0:
            raise ValueError("Y has 0 labels (no label id in any list, or a matrix of 0 columns); training needs "
                             "labels: pass n_labels or labels in Y")
        test = None
        if X_val is not None or Y_val is not None:
            if X_val is None or Y_val is None:
                raise ValueError("a validation set needs both X_val and Y_val")
            Xv = _features(X_val, "X_val")
            if Xv.shape[1] != X.shape[1]:
                raise ValueError(f"X_val has {Xv.shape[1]} features, X has {X.shape[1]}")
            test = XMCData(Xv, labels_matrix(Y_val, Xv.shape[0], train.n_labels))
        config = self.config.resolve(*resolve_shape(train))
        notice_threads(self.comm, config)
        model = T.build_network((train.n_features, train.n_labels), config, self.comm)
        T.init_from_data(model, train)
        bar = Progress(self.comm, T.total_steps(config, train.n_points), 0, not progress, None,
                       config.batch_size, lines=False, bar=progress)
        try:
            model, history = T.fit(train, config, test, model=model, callback=bar,
                                   index_progress=progress and self.comm.rank == 0)
        finally:
            bar.close()
        # the settings stay as given: a second fit resolves them from its own data
        self._model, self.config_, self.history = model, model.config, history
        self.n_features_in_ = train.n_features
        self._props = propensity.compute(train.Y, *config.propensity_constants) if train.n_points >= 3 else None
        return self

    # -- inference -----------------------------------------------------------------

    def _fitted(self):
        if self._model is None:
            raise ValueError("this Model is not trained: call fit(X, Y) or Model.load(run_dir) first")
        return self._model

    def predict(self, X, k: int | None = None, lsh: bool = False, sparse: bool = False, *,
                top_k: int | None = None):
        """The top k labels of each row of X csr [n, n_features], best first (ties to the
        lower label id, dslide.model.topk).

        k: default 5; top_k is the same (napkinXC's and omikuji's name), give one of them.
        Returns (ids int64 [n, k], scores float64 [n, k]; -1 where fewer than k labels were
        scored), or with sparse=True a csr float64 [n, n_labels] holding each row's top-k
        scores (as `predict_csr`). lsh: score only what the output layer's inference index
        retrieves (a model with an LSH output layer only).
        """
        from dslide import train as T
        from dslide.infer.predict import predict_topk_scores
        from dslide.io import formats

        model = self._fitted()
        if k is not None and top_k is not None and k != top_k:
            raise ValueError(f"k = {k!r} and top_k = {top_k!r}: they are the same setting, give one of them")
        k = check_k(next((v for v in (k, top_k) if v is not None), 5), model.n_labels)
        check_lsh(model, lsh)
        ids, scores = predict_topk_scores(model, _features(X), k, exact=not lsh)
        return formats.predictions_csr(ids, scores, model.n_labels) if sparse else (ids, scores)

    def predict_csr(self, X, k: int | None = None, lsh: bool = False, *, top_k: int | None = None):
        """The top-k scores as PECOS's `predict` returns them: csr float64 [n, n_labels], row i
        holding the scores (logits, or the fused scores with neighbour labels) of its k best
        labels, columns sorted; ranked by score, ties to the lower label id, as `predict`'s ids.
        Arguments as `predict`."""
        return self.predict(X, k, lsh, sparse=True, top_k=top_k)

    def evaluate(self, X, Y, k: int = 5, lsh: bool = False, propensity: str | tuple | None = None) -> dict:
        """P@1..k, nDCG@1..k and (with the training labels' propensities) PSP@k and PSnDCG@k.

        Y: csr indicator [n, n_labels] or label lists. propensity: None (the constants the
        model was trained with), a preset name (dslide.config.PROPENSITY_PRESETS) or (A, B).
        Returns a dict of floats in [0, 1].
        """
        from dslide import metrics
        from dslide import propensity as P

        model = self._fitted()
        X = _features(X)
        Yc = labels_matrix(Y, X.shape[0], model.n_labels)
        ids, _ = self.predict(X, k=k, lsh=lsh)
        props = self._props
        if props is not None and propensity is not None:
            props = P.with_constants(props, *propensity_constants(propensity))
        return metrics.evaluate(Yc, ids, k=k, inv_prop=None if props is None else props["inv_prop"])

    # -- files ---------------------------------------------------------------------

    def save(self, run_dir, overwrite: bool = False) -> Path:
        """Write the run directory `dslide train` writes (config.toml, checkpoints/,
        propensity.npz): `dslide eval/predict --model run_dir` and `Model.load` read it.
        Every rank calls it (each writes its slices). Returns the checkpoint's path.

        The command line's rules (dslide.io.rundir.check_new): run_dir must be new or empty, or
        hold a dslide run and overwrite=True (its files are then replaced, other files kept);
        a directory holding anything else is refused, as is one in use."""
        from dslide import propensity
        from dslide import train as T
        from dslide.infer.parts import sections
        from dslide.io import checkpoint as ck
        from dslide.io import rundir

        model = self._fitted()
        run_dir = Path(run_dir)
        hint = "pass overwrite=True to replace it, or choose another directory"

        def replace(d):  # under run_dir's lock, when it is not new: the rules again
            rundir.check_new(d, bool(overwrite), "run_dir", hint, locked=True)

        # the run is built whole in a directory beside run_dir and then moved into place, so a
        # save that fails midway leaves no half-built run_dir and an old run there untouched
        tmp, error = None, None
        if self.comm.rank == 0:
            try:  # whole files, never through a planted link (dslide.io.rundir)
                rundir.check_new(run_dir, bool(overwrite), "run_dir", hint)
                tmp = rundir.begin_build(run_dir)
                rundir.mark(tmp)
                rundir.write_atomic(tmp / "config.toml", config_toml(model.config))
                if self._props is not None:
                    propensity.save(tmp, self._props)
            except (ValueError, OSError) as e:
                error = e
        message = self.comm.bcast_object(None if error is None else str(error))
        built = Path(self.comm.bcast_object(None if tmp is None else str(tmp)) or ".")
        try:
            if message is not None:  # every rank raises, none waits in a collective below
                raise error if error is not None else ValueError(message)
            out = []
            T.save_model(model, lambda m, c: out.append(ck.save(m.network, built, c, extra={"history": m.history},
                                                                sections=sections(m))))
            self.comm.barrier()
            path = self.comm.bcast_object(str(out[0]) if out else None)
            error = None
            if self.comm.rank == 0:
                try:
                    rundir.finish_build(built, run_dir, "dslide.Model.save", replace)
                except (ValueError, OSError) as e:
                    error = e
                tmp = None  # finish_build removed it on an error
            message = self.comm.bcast_object(None if error is None else str(error))
            if message is not None:
                raise error if error is not None else ValueError(message)
            return str(run_dir / Path(path).relative_to(built))
        finally:
            if tmp is not None:
                rundir.abandon_build(tmp)

    @classmethod
    def load(cls, run_dir, *, comm=None) -> "Model":
        """A trained model from a run directory (of `save` or `dslide train`), split over
        the ranks of `comm` (default: the MPI world), with this process's threads."""
        from dslide import propensity

        comm = _comm(comm)
        self = cls.__new__(cls)
        self.comm = comm
        self._model = load_model(os.fspath(run_dir), comm)
        self.config = self.config_ = self._model.config
        self._settings = {}
        self.n_features_in_ = self._model.n_features
        self._props = propensity.load(run_dir, self._model.n_labels)
        self.history = list(self._model.history)
        return self

    # -- description ---------------------------------------------------------------

    @property
    def n_features(self) -> int:
        return self._fitted().n_features

    @property
    def n_labels(self) -> int:
        return self._fitted().n_labels

    def __repr__(self) -> str:
        if self._model is None:
            return f"dslide.Model(untrained, {self.comm.size} rank(s))"
        return (f"dslide.Model({self.n_features:,} features -> {self.n_labels:,} labels, step "
                f"{self._model.network.step}, {self.comm.size} rank(s))")


def _comm(comm):
    """The communicator a Model runs on: a dslide.comm.Comm, or None for the MPI world."""
    from dslide.comm import Comm

    if comm is None:
        return Comm.world()
    if not isinstance(comm, Comm):
        raise ValueError(f"comm = {comm!r} must be a dslide.comm.Comm (e.g. dslide.comm.Comm(mpi4py_comm)) "
                         f"or None (the MPI world)")
    return comm


def propensity_constants(value) -> tuple[float, float]:
    """(A, B) from a preset name of dslide.config.PROPENSITY_PRESETS or a pair of numbers."""
    from dslide.config import PROPENSITY_PRESETS

    if isinstance(value, str):
        if value not in PROPENSITY_PRESETS:
            raise ValueError(f"propensity = {value!r} is not valid; choose one of "
                             f"{', '.join(map(repr, PROPENSITY_PRESETS))} or give (A, B)")
        return PROPENSITY_PRESETS[value]
    try:
        a, b = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(f"propensity = {value!r} must be a preset name "
                         f"({', '.join(map(repr, PROPENSITY_PRESETS))}) or a pair (A, B)") from None
    return a, b
