"""Sharded checkpoints: one directory of .npy files per rank plus a manifest, written atomically.

Layout of a run directory:

    RUN_DIR/checkpoints/step-000001200/rank-0000/layer0.W.npy     each rank's slices,
                                                /layer0.W.m.npy   one file per array
                                      /rank-0001/...
                                      /manifest.json              written last
    RUN_DIR/checkpoints/LATEST                                    name of the newest complete one

Every array goes to its own file, written under a temporary name in chunks
(its SHA-256 computed on the way, no second read), fsynced and renamed: a
save needs no memory beyond one chunk, whatever the model's size. The
manifest (config, world size, step, network shape, each file's SHA-256,
shape, dtype and whether inference needs it) comes last, and only then is
LATEST replaced (write to a temporary name, `os.replace`). A kill at any
moment leaves LATEST naming a complete checkpoint; older ones are deleted
only after that. The files themselves (an array to its .npy file and back,
in bounded memory; names that stay inside the directory) are
dslide.io.checkpoint_files.

Reading goes straight into the network's own arrays (the ones its layers'
`state()` returns), chunk by chunk with `readinto`, hashing as it reads: no
second copy of a layer in memory, and no memory map either (mapped file
pages would count in the process's resident memory). With the same number
of ranks each rank reads its own directory, hash tables included, and the
run continues exactly. With another number of ranks each rank reads, from
the old files, only the slices of the columns it now owns (resharding; those
files are verified by a second thread reading them whole) and rebuilds its
hash tables from the weights. Every rank reads all its files before any layer takes
its arrays, and the ranks then agree (`read_together`): a read that failed on one rank
fails on all of them alike (ReadFailed), so that they can try another checkpoint
together (dslide.session.load_model, reading a run that is still training).

A weights-only checkpoint (`checkpoint_moments = false`, or `dslide export`
of a full one) holds what inference needs: each layer's W and b and the
output layer's inference index. `eval` and `predict` read only those from
any checkpoint; resuming training from a weights-only one is refused.

Loading never unpickles. Randomness needs no state: every draw is a function
of (seed, step, ...), and the data order of (seed, epoch); the step is in
the manifest.

Nothing is read or written outside the checkpoint directory: the names in a
manifest (`ranks[].dir`, each array's `file`) and in LATEST must be plain
names (no `/`, no `..`) that resolve inside it, or the checkpoint is refused
(CheckpointError), as is a manifest that is not the object this module writes.
Temporary files are created exclusively (`dslide.io.rundir`), never opened
through a planted symlink. A save refuses parameters that are not finite
(NaN, inf: a diverged run), so LATEST keeps naming the last good checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from dslide import hooks
from dslide.io import rundir
from dslide.io.checkpoint_files import (CheckpointError, Digest, NpyFile, check_manifest, fsync_dir, inside, mismatch,
                                     write_npy)
from dslide.comm import Comm
from dslide.config import Config
from dslide.model.network import Network

FORMAT = 2


def _write_atomic(path: Path, data: bytes) -> None:
    rundir.write_atomic(path, data)  # a fresh temporary file (never through a link), fsync, rename


# ----------------------------------------------------------------------------
# saving
# ----------------------------------------------------------------------------


def _file_name(key: str) -> str:
    """'layer0/W.m' -> 'layer0.W.m.npy'."""
    return key.replace("/", ".") + ".npy"


def save(net: Network, run_dir, comm: Comm, extra: dict | None = None, keep: int = 1,
         weights_only: bool | None = None, sections=()) -> Path:
    """Write a checkpoint of every rank's slices (collective: every rank calls it).

    weights_only: only what inference needs (W, b; the sections); default:
    not config.checkpoint_moments. Such a checkpoint cannot be resumed from.
    sections: the model's parts that are no layer's (dslide.infer.parts: `name`, `state()`),
    saved as "<name>/<key>" beside the layers, every array one inference needs.
    """
    if weights_only is None:
        weights_only = not net.config.checkpoint_moments
    # a diverged run's parameters are never saved: LATEST keeps naming the last good checkpoint
    bad = [b for b in comm.allgather_object(_non_finite(net, weights_only)) if b]
    if bad:
        raise CheckpointError(f"refusing to save a checkpoint at step {net.step}: {bad[0]} holds non-finite "
                              f"values (NaN or inf; training diverged), the last checkpoint is kept")
    root = Path(run_dir) / "checkpoints"
    name = None
    if comm.rank == 0:
        # a fresh directory, never the one LATEST names (a save of the same step again)
        root.mkdir(parents=True, exist_ok=True)
        name, n = f"step-{net.step:09d}", 0
        while (root / name).exists():
            n += 1
            name = f"step-{net.step:09d}.{n}"
        (root / name).mkdir()
    name = comm.bcast_object(name)
    target = root / name
    try:
        _save_into(net, target, comm, extra, weights_only, sections)
    except OSError:
        # a fresh directory, never the one LATEST names: a failed save (a full disk) leaves none of it
        shutil.rmtree(target, ignore_errors=True)
        raise
    if comm.rank == 0:
        # older checkpoints, and leftovers of saves that died, go only now
        old = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != name)
        for p in old[: max(0, len(old) - (keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
    comm.barrier()
    return target


def _save_into(net: Network, target: Path, comm: Comm, extra, weights_only: bool, sections=()) -> None:
    """save's writing: each rank's files in target, then (rank 0) the manifest and LATEST."""
    root, name = target.parent, target.name
    own = target / f"rank-{comm.rank:04d}"
    own.mkdir()
    listing = {}
    for layer in net.layers:
        inference = set(layer.state(weights_only=True))
        for key, arr in layer.state(weights_only=weights_only).items():
            full = f"layer{layer.index}/{key}"
            fname = _file_name(full)
            digest = write_npy(own / fname, arr)
            listing[full] = {"file": fname, "sha256": digest, "shape": list(np.shape(arr)),
                             "dtype": np.lib.format.dtype_to_descr(np.asarray(arr).dtype),
                             "inference": key in inference}
    for section in sections:
        for key, arr in section.state().items():
            full = f"{section.name}/{key}"
            fname = _file_name(full)
            listing[full] = {"file": fname, "sha256": write_npy(own / fname, arr), "shape": list(np.shape(arr)),
                             "dtype": np.lib.format.dtype_to_descr(np.asarray(arr).dtype), "inference": True}
    fsync_dir(own)
    hooks.call(hooks.CHECKPOINT, "rank-file")
    listings = comm.allgather_object(listing)
    if comm.rank == 0:
        manifest = {
            "format": FORMAT,
            "contents": "weights" if weights_only else "full",
            "step": net.step,
            "world_size": comm.size,
            "parallel": net.config.parallel,
            "n_features": net.n_features,
            "n_labels": net.n_labels,
            "n_params": net.n_params,
            "layers": net.describe(),
            "bounds": [layer.bounds.tolist() for layer in net.layers],  # uneven shards differ from even
            "config": net.config.to_dict(),
            "rng": {"kind": "counter-based", "seed": net.config.seed, "step": net.step},
            "prior_shift": net.prior_shift,  # what the output biases carry (Network.shift_output_prior)
            "ranks": [{"dir": f"rank-{r:04d}", "arrays": lst} for r, lst in enumerate(listings)],
            "extra": extra or {},
        }
        _write_atomic(target / "manifest.json", json.dumps(manifest, indent=1).encode())
        hooks.call(hooks.CHECKPOINT, "before-latest")
        _write_atomic(root / "LATEST", (name + "\n").encode())


#: the arrays a save checks for NaN and inf: parameters and Adam's moments (others, such as
#: tables, may hold sentinels)
_CHECKED = ("W", "b", "W.m", "W.v", "b.m", "b.v")


def _non_finite(net: Network, weights_only: bool) -> str | None:
    """The first parameter array of this rank holding NaN or inf (as "layer1/W on rank r"), or None;
    read in blocks of 4M values, so no temporary the size of a layer."""
    for layer in net.layers:
        for key, arr in layer.state(weights_only=weights_only).items():
            if key not in _CHECKED or np.asarray(arr).dtype.kind != "f":
                continue
            flat = np.asarray(arr).reshape(-1)
            for a in range(0, flat.size, 1 << 22):
                if not np.isfinite(flat[a:a + (1 << 22)]).all():
                    return f"layer{layer.index}/{key} on rank {net.comm.rank}"
    return None


def export(run_dir, out_dir) -> Path:
    """A new run directory `out_dir` holding the weights of `run_dir`'s latest checkpoint
    (W, b and the inference index of every rank, no optimiser state), for deployment:
    `eval` and `predict` take it as --model. Files are copied one by one (no MPI, bounded
    memory); the configuration and metrics come along. Returns the new checkpoint's path."""
    src = latest(run_dir)
    manifest = read_manifest(src)  # every name in it checked: plain, inside src
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise CheckpointError(f"{out_dir} exists and is not empty; export writes a new run directory")
    # built beside out_dir and renamed into place: a failed export leaves no half-built directory
    tmp = rundir.begin_build(out_dir)
    try:
        target = _export(Path(run_dir), src, manifest, tmp)
    except BaseException:
        rundir.abandon_build(tmp)
        raise
    try:
        rundir.finish_build(tmp, out_dir, "dslide export")
    except rundir.RunDirError:  # another export got there first
        raise CheckpointError(f"{out_dir} exists and is not empty; export writes a new run directory") from None
    return out_dir / target.relative_to(tmp)


def _export(run_dir: Path, src: Path, manifest: dict, out_dir: Path) -> Path:
    root = out_dir / "checkpoints"
    target = root / src.name
    target.mkdir(parents=True)
    for extra_file in ("config.toml", "metrics.json"):
        if (run_dir / extra_file).is_file():
            with open(run_dir / extra_file, "rb") as f, rundir.replacing(out_dir / extra_file) as g:
                shutil.copyfileobj(f, g)
    where = src / "manifest.json"
    ranks = []
    for entry in manifest["ranks"]:
        from_dir = inside(src, entry["dir"], "rank directory", where)
        to_dir = target / entry["dir"]
        to_dir.mkdir()
        kept = {k: v for k, v in entry["arrays"].items() if v["inference"]}
        for k, v in kept.items():
            f_in = inside(from_dir, v["file"], "file", where)
            with open(f_in, "rb") as f, rundir.replacing(to_dir / v["file"]) as g:
                h = hashlib.sha256()
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
                    g.write(chunk)
                if h.hexdigest() != v["sha256"]:
                    raise mismatch(f_in, where)
        fsync_dir(to_dir)
        ranks.append({"dir": entry["dir"], "arrays": kept})
    manifest = {**manifest, "contents": "weights", "ranks": ranks,
                "extra": {**manifest.get("extra", {}), "exported_from": str(src)}}
    _write_atomic(target / "manifest.json", json.dumps(manifest, indent=1).encode())
    _write_atomic(root / "LATEST", (src.name + "\n").encode())
    return target


# ----------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------


def latest(run_dir) -> Path:
    """The newest complete checkpoint directory of a run (CheckpointError if none)."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "LATEST"
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    if not pointer.exists():
        raise CheckpointError(f"{run_dir} holds no checkpoint ({pointer} is missing)")
    try:
        name = pointer.read_bytes()[:1024].decode().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{pointer} is unreadable: {e}") from None
    target = inside(root, name, "the checkpoint name", pointer)
    if not (target / "manifest.json").is_file():
        raise CheckpointError(f"{pointer} names {name}, which has no manifest.json")
    return target


def read_manifest(path) -> dict:
    """A checkpoint's manifest, checked: the object `save` writes, with every name in it a
    plain one inside the checkpoint (CheckpointError naming the file and the field otherwise)."""
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path / 'manifest.json'} is unreadable: {e}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path / 'manifest.json'} is not a checkpoint manifest: a JSON object was "
                              f"expected, it holds a {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {manifest.get('format')!r} (format 1: one .npz per "
                              f"rank, from an older dslide); this dslide reads format {FORMAT}")
    check_manifest(manifest, path / "manifest.json")
    return manifest


def config_of(path) -> Config:
    """The configuration a checkpoint was trained with, its output_split the one its layers
    have (checkpoints from before the setting split every output by columns)."""
    manifest = read_manifest(path)
    try:
        return Config.from_dict({**Config.flatten(manifest["config"]), "output_split": output_split_of(manifest)})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{Path(path) / 'manifest.json'}: its configuration is not valid: {e}") from None


def output_split_of(manifest: dict) -> str:
    """"rows" or "columns": how the output layer of a checkpoint (its manifest) is split."""
    return "rows" if manifest["layers"][-1].get("split") == "rows" else "columns"


def size_bytes(path) -> int:
    """Bytes of a checkpoint's files (every rank's)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


class _Reader:
    """One old rank's arrays of a checkpoint: opens and verifies its files as they are read."""

    def __init__(self, path: Path, entry: dict, verify: bool):
        self.manifest = path / "manifest.json"
        self.dir = inside(path, entry["dir"], "rank directory", self.manifest)
        self.arrays, self.verify = entry["arrays"], verify
        self.digests = []

    def has(self, key: str) -> bool:
        return key in self.arrays

    def open(self, key: str) -> NpyFile:
        f = inside(self.dir, self.arrays[key]["file"], "file", self.manifest)
        if not f.exists():
            raise CheckpointError(f"{self.manifest} lists {f.relative_to(self.dir.parent)}, which is missing")
        npy = NpyFile(f)
        if list(npy.shape) != self.arrays[key]["shape"]:
            npy.close()
            raise CheckpointError(f"{f} holds an array of shape {npy.shape}; {self.manifest} lists "
                                  f"{tuple(self.arrays[key]['shape'])}")
        return npy

    def read_all(self, key: str, out: np.ndarray | None) -> np.ndarray:
        """The whole array: into `out` when it has the file's shape and dtype, else a new array."""
        npy = self.open(key)
        try:
            if out is None or out.shape != npy.shape or out.dtype != npy.dtype or not out.flags.c_contiguous:
                out = np.empty(npy.shape, npy.dtype)
            h = hashlib.sha256() if self.verify else None
            npy.read_all(out, h)
        finally:
            npy.close()
        if h is not None and h.hexdigest() != self.arrays[key]["sha256"]:
            raise mismatch(npy.path, self.manifest)
        return out

    def read_slice(self, key: str, axis: int, a: int, b: int, out: np.ndarray) -> None:
        npy = self.open(key)
        try:
            if self.verify:
                self.digests.append(Digest(npy.path, self.arrays[key]["sha256"], self.manifest))
            npy.read_slice(axis, a, b, out)
        finally:
            npy.close()

    def check(self) -> None:
        for d in self.digests:
            d.check()


def load_into(net: Network, path, comm: Comm, verify: bool = True, weights_only: bool = False,
              sections=()) -> dict:
    """Restore `net` (built with the checkpoint's config, on any number of ranks) from
    checkpoint directory `path`, then the `sections` (as `save`'s: each gets its arrays, {}
    when the checkpoint has none, through `load_state(arrays, same_layout)`). Returns the manifest.

    weights_only: read W, b and the inference index only (eval, predict); Adam's moments
    stay unallocated (zero pages). Without it a weights-only checkpoint is refused.
    verify: check every file read against its SHA-256 in the manifest (a mismatch raises
    CheckpointError; the network's state is then undefined).

    Every rank reads its files first, then the ranks agree (`read_together`): a read that
    fails on any rank (a file gone, because a run still training replaced the checkpoint)
    raises ReadFailed on every rank, before any layer takes its arrays (whose rebuilding
    may exchange between ranks).
    """
    path = Path(path)
    manifest, (parts, section_parts) = read_together(
        comm, lambda: _read_parts(net, path, verify, weights_only, comm, sections), path)
    try:
        for layer, arrays, same in parts:
            layer.load_state(arrays, same_layout=same, weights_only=weights_only)
        for section, arrays, same in section_parts:
            section.load_state(arrays, same_layout=same)
    except CheckpointError:
        raise
    except ValueError as e:  # an array that fails its checks (dslide.validate), whatever its hash
        raise CheckpointError(f"{path}: {e}") from None
    net.step = int(manifest["step"])
    net.prior_shift, net._trained_b = float(manifest.get("prior_shift", 0.0)), None
    return manifest


class ReadFailed(CheckpointError):
    """A checkpoint that some rank could not read, raised on every rank alike (`read_together`):
    they may all try another one together."""


def read_together(comm: Comm, read, path):
    """read() on every rank (file reads only, no exchange between ranks); when it fails on
    any rank (CheckpointError, OSError), ReadFailed on every rank: the rank's own message
    where it failed, elsewhere one naming the ranks that failed. One small collective."""
    error, result = None, None
    try:
        result = read()
    except (CheckpointError, OSError) as e:
        error = e
    failed = comm.failed_ranks(error is not None)
    if error is not None:
        raise ReadFailed(str(error)) from None
    if failed:
        ranks = f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
        raise ReadFailed(f"{path}: {ranks} of {comm.size} could not read {'their' if len(failed) > 1 else 'its'} "
                         f"part of it")
    return result


def _read_parts(net: Network, path: Path, verify: bool, weights_only: bool, comm: Comm, sections=()):
    """(manifest, ([(layer, its arrays, same_layout)], [(section, its arrays, same_layout)])):
    this rank's files read and verified, no layer or section changed yet."""
    manifest = read_manifest(path)
    try:
        return manifest, _read_into(net, path, manifest, comm, verify, weights_only, sections)
    except KeyError as e:  # an array the network needs that the manifest does not list
        raise CheckpointError(f"{path / 'manifest.json'} lists no {e.args[0]!r}, which this network "
                              f"needs: not a checkpoint of this network") from None
    except CheckpointError:
        raise
    except ValueError as e:  # a manifest entry numpy refuses (a dtype, a shape)
        raise CheckpointError(f"{path}: {e}") from None


def _read_into(net: Network, path: Path, manifest: dict, comm: Comm, verify: bool, weights_only: bool,
               sections=()) -> tuple:
    if manifest["layers"] != net.describe() or manifest["n_features"] != net.n_features \
            or manifest["n_labels"] != net.n_labels:
        raise CheckpointError(
            f"{path} holds a network of shape {_shape(manifest['layers'])} over {manifest['n_features']} features "
            f"and {manifest['n_labels']} labels; this run's is {_shape(net.describe())} over {net.n_features} "
            f"features and {net.n_labels} labels" + _split_hint(manifest["layers"], net.describe()))
    if manifest.get("contents") == "weights" and not weights_only:
        raise CheckpointError(
            f"{path} holds weights only (saved with checkpoint_moments = false, or by dslide export): "
            f"eval and predict can use it, but training cannot resume from it (Adam's moments and the "
            f"hash tables are not in it); resume from a full checkpoint, or start a new run")
    ranks = manifest["ranks"]
    if len(ranks) != manifest["world_size"]:
        raise CheckpointError(f"{path / 'manifest.json'} says {manifest['world_size']} ranks but lists {len(ranks)}")
    # the same layout: as many ranks, each owning the same columns (shard weights may differ)
    # (checkpoints without "bounds" were split evenly over their ranks, or not at all in data mode)
    saved = manifest.get("bounds") or [_even(l["n"], manifest["world_size"] if manifest["parallel"] == "model" else 1)
                                       for l in manifest["layers"]]
    same = manifest["world_size"] == comm.size and manifest["parallel"] == net.config.parallel \
        and saved == [layer.bounds.tolist() for layer in net.layers]
    if same or manifest["parallel"] == "data":
        # data-parallel checkpoints hold the whole model in every rank's files: read one
        reader = _Reader(path, ranks[comm.rank if same else 0], verify)
        if manifest["parallel"] == "data" and not same:
            parts = _read_resharded(net, [reader], whole=True, weights_only=weights_only)
        else:
            parts = _read_same(net, reader, weights_only, _legacy(net, sections))
        readers = [reader]
    else:
        readers = [_Reader(path, e, verify) for e in ranks]
        parts = _read_resharded(net, readers, whole=False, weights_only=weights_only)
    section_parts = [(section, _read_section(section, readers[0], same, net), same) for section in sections]
    for r in readers:
        r.check()
    return parts, section_parts


def _wanted(reader: _Reader, key: str, weights_only: bool) -> bool:
    return reader.has(key) and (not weights_only or reader.arrays[key]["inference"])


def _legacy(net: Network, sections) -> tuple:
    """The keys under which checkpoints from before sections kept a section's arrays: the
    output layer's "layer<L>/<old prefix>"."""
    return tuple(f"layer{net.layers[-1].index}/{old}" for s in sections for old, _ in s.legacy)


def _read_section(section, reader: _Reader, same: bool, net: Network) -> dict:
    """A section's arrays from this rank's files (the same layout) or, for a new layout, those
    every rank holds alike from the first rank's; found under "<name>/" or, in a checkpoint
    from before sections, where its `legacy` says."""
    axes = section.shard_axes()
    pre = f"{section.name}/"
    places = [(pre, "")]
    if not any(k.startswith(pre) for k in reader.arrays):
        places = [(f"layer{net.layers[-1].index}/{old}", new) for old, new in section.legacy]
    arrays = {}
    for full in list(reader.arrays):
        for old, new in places:
            if full.startswith(old):
                key = new + full[len(old):]
                if same or (key in axes and axes[key] is None):
                    arrays[key] = reader.read_all(full, None)
    return arrays


def _read_same(net: Network, reader: _Reader, weights_only: bool, skip: tuple = ()) -> list:
    """Every array of this rank's own files, read into the layer's live arrays where they exist
    (but for the keys starting with one of `skip`: a section's, in an old checkpoint)."""
    parts = []
    for layer in net.layers:
        pre = f"layer{layer.index}/"
        live = layer.state(weights_only=weights_only)
        arrays = {}
        for full in reader.arrays:
            if full.startswith(pre) and _wanted(reader, full, weights_only) and not full.startswith(skip):
                key = full[len(pre):]
                arrays[key] = reader.read_all(full, live.get(key))
        parts.append((layer, arrays, True))
    return parts


def _read_resharded(net: Network, readers: list, whole: bool, weights_only: bool) -> list:
    """Each layer's slice [lo, hi) assembled from the old ranks' slices along the axes the
    layer names (`shard_axes`), read straight into its live arrays; arrays every rank holds
    alike come from the first rank's files. Each layer rebuilds its own derived state when
    it takes them (load_state with same_layout False)."""
    parts = []
    for layer in net.layers:
        pre = f"layer{layer.index}/"
        if whole:
            bounds = np.array([0, layer.bounds[-1]])
        else:  # the old slices' sizes along the split axis (W's: neurons, or rows for a row split)
            axis_w = layer.shard_axes()["W"]
            sizes = [r.arrays[pre + "W"]["shape"][axis_w] for r in readers]
            bounds = np.concatenate(([0], np.cumsum(sizes)))
        live = layer.state(weights_only=weights_only)
        arrays = {}
        for key, axis in layer.shard_axes().items():
            if not _wanted(readers[0], pre + key, weights_only):
                continue
            if axis is None:
                arrays[key] = readers[0].read_all(pre + key, None)
                continue
            meta = readers[0].arrays[pre + key]
            shape = list(meta["shape"])
            shape[axis] = layer.hi - layer.lo
            dtype = np.dtype(np.lib.format.descr_to_dtype(meta["dtype"]))
            out = live.get(key)
            if out is None or list(out.shape) != shape or out.dtype != dtype:
                out = np.empty(shape, dtype)
            for r, reader in enumerate(readers):
                a, b = max(layer.lo, bounds[r]), min(layer.hi, bounds[r + 1])
                if a < b:
                    sl = [slice(None)] * len(shape)
                    sl[axis] = slice(a - layer.lo, b - layer.lo)
                    reader.read_slice(pre + key, axis, int(a - bounds[r]), int(b - bounds[r]), out[tuple(sl)])
            arrays[key] = out
        parts.append((layer, arrays, False))
    return parts


def _even(n: int, world: int) -> list:
    from dslide.model.sharding import shard_bounds

    return shard_bounds(n, world).tolist()


def _shape(layers: list[dict]) -> str:
    return " -> ".join(f"{l['n']}({l['kind']}{', by rows' if l.get('split') == 'rows' else ''})" for l in layers)


def _split_hint(saved: list[dict], mine: list[dict]) -> str:
    """Where the layers differ only in the output's split: the setting that matches them."""
    plain = [[{k: v for k, v in l.items() if k != "split"} for l in ls] for ls in (saved, mine)]
    if plain[0] != plain[1]:
        return ""
    want = "rows" if saved[-1].get("split") == "rows" else "columns"
    return (f"; the same layers, with the output split by {want} in the checkpoint: set "
            f"output_split = {want!r} to load it")
