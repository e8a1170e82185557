"""Sharded checkpoints: one file per rank plus a manifest, written atomically.

Layout of a run directory:

    RUN_DIR/checkpoints/step-000001200/rank-0000.npz   each rank's slices
                                      /rank-0001.npz
                                      /manifest.json   written last
    RUN_DIR/checkpoints/LATEST                         name of the newest complete one

A checkpoint is written into its own directory, each file under a temporary
name then renamed; the manifest (config, world size, step, network shape,
the files' SHA-256) comes last, and only then is LATEST replaced (write to a
temporary name, `os.replace`). A kill at any moment leaves LATEST naming a
complete checkpoint; older ones are deleted only after that.

Loading never unpickles (`np.load(..., allow_pickle=False)`). With the same
number of ranks every rank reads its own file, hash tables included, and the
run continues exactly. With another number of ranks each rank reads the
columns it now owns from the old files (resharding) and rebuilds its hash
tables from the weights.

Randomness needs no state: every draw is a function of (seed, step, ...),
and the data order of (seed, epoch); the step is in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np

from dslide.comm import Comm
from dslide.config import Config
from dslide.network import Network

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt or of another network."""


def _fault(point: str) -> None:
    """Test hook: DSLIDE_FAULT=<point> makes the process die at that point (as a kill would)."""
    if os.environ.get("DSLIDE_FAULT") == point:
        os._exit(75)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(net: Network, run_dir, comm: Comm, extra: dict | None = None, keep: int = 1) -> Path:
    """Write a checkpoint of every rank's slices (collective: every rank calls it)."""
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
    arrays = {}
    for layer in net.layers:
        for key, arr in layer.state().items():
            arrays[f"layer{layer.index}/{key}"] = arr
    path = target / f"rank-{comm.rank:04d}.npz"
    tmp = target / f".rank-{comm.rank:04d}.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    _fault("checkpoint-rank-file")
    os.replace(tmp, path)
    digests = comm.allgather_object(_sha256(path))
    if comm.rank == 0:
        manifest = {
            "format": FORMAT,
            "step": net.step,
            "world_size": comm.size,
            "parallel": net.config.parallel,
            "n_features": net.n_features,
            "n_labels": net.n_labels,
            "layers": net.describe(),
            "config": net.config.to_dict(),
            "rng": {"kind": "counter-based", "seed": net.config.seed, "step": net.step},
            "files": [{"name": f"rank-{r:04d}.npz", "sha256": d} for r, d in enumerate(digests)],
            "extra": extra or {},
        }
        _write_atomic(target / "manifest.json", json.dumps(manifest, indent=1).encode())
        _fault("checkpoint-before-latest")
        _write_atomic(root / "LATEST", (name + "\n").encode())
        # older checkpoints, and leftovers of saves that died, go only now
        old = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != name)
        for p in old[: max(0, len(old) - (keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
    comm.barrier()
    return target


def latest(run_dir) -> Path:
    """The newest complete checkpoint directory of a run (CheckpointError if none)."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "LATEST"
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    if not pointer.exists():
        raise CheckpointError(f"{run_dir} holds no checkpoint ({pointer} is missing)")
    target = root / pointer.read_text().strip()
    if not (target / "manifest.json").exists():
        raise CheckpointError(f"{pointer} names {target.name}, which has no manifest.json")
    return target


def read_manifest(path) -> dict:
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path / 'manifest.json'} is unreadable: {e}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {manifest.get('format')!r}; this dslide reads {FORMAT}")
    return manifest


def config_of(path) -> Config:
    """The configuration a checkpoint was trained with."""
    d = dict(read_manifest(path)["config"])
    d["hidden"] = tuple(d["hidden"])
    return Config.from_dict(d)


class _Digest(threading.Thread):
    """The SHA-256 of a checkpoint file, computed in a second thread while the file loads
    (hashlib and file reads release the GIL); `check` waits for it and compares."""

    def __init__(self, f: Path, want: str, manifest: Path):
        super().__init__(daemon=True)
        self.f, self.want, self.manifest = f, want, manifest
        self.got, self.error = None, None
        self.start()

    def run(self):
        try:
            self.got = _sha256(self.f)
        except OSError as e:
            self.error = e

    def check(self) -> None:
        self.join()
        if self.error is not None:
            raise CheckpointError(f"{self.f} could not be read to verify it: {self.error}")
        if self.got != self.want:
            raise CheckpointError(f"{self.f} does not match the checksum in {self.manifest}: the file is corrupt "
                                  f"or from another checkpoint")


def _open(path: Path, entry: dict, digests: list | None):
    """np.load of a rank file; with `digests`, its checksum starts in a second thread (appended there)."""
    f = path / entry["name"]
    if not f.exists():
        raise CheckpointError(f"{path / 'manifest.json'} lists {entry['name']}, which is missing")
    if digests is not None:
        digests.append(_Digest(f, entry["sha256"], path / "manifest.json"))
    return np.load(f, allow_pickle=False, mmap_mode="r")


def load_into(net: Network, path, comm: Comm, verify: bool = True) -> dict:
    """Restore `net` (built with the checkpoint's config, on any number of ranks)
    from checkpoint directory `path`. Returns the manifest.

    verify: check each file read against the SHA-256 in the manifest. The digests
    run in second threads while the arrays load; a mismatch raises
    CheckpointError before this returns (the network's state is then undefined),
    and explains a load that failed on a corrupt file.
    """
    path = Path(path)
    digests = [] if verify else None
    try:
        manifest = _load_into(net, path, comm, digests)
    except Exception:
        for d in digests or ():
            d.check()  # a corrupt file is the better explanation of a failed load
        raise
    for d in digests or ():
        d.check()
    comm.barrier()
    return manifest


def _load_into(net: Network, path: Path, comm: Comm, digests: list | None) -> dict:
    manifest = read_manifest(path)
    if manifest["layers"] != net.describe() or manifest["n_features"] != net.n_features \
            or manifest["n_labels"] != net.n_labels:
        raise CheckpointError(
            f"{path} holds a network of shape {_shape(manifest['layers'])} over {manifest['n_features']} features "
            f"and {manifest['n_labels']} labels; this run's is {_shape(net.describe())} over {net.n_features} "
            f"features and {net.n_labels} labels")
    files = manifest["files"]
    if len(files) != manifest["world_size"]:
        raise CheckpointError(f"{path / 'manifest.json'} says {manifest['world_size']} ranks but lists {len(files)} files")
    same = manifest["world_size"] == comm.size and manifest["parallel"] == net.config.parallel
    if same or manifest["parallel"] == "data":
        # data-parallel checkpoints hold the whole model in every file: read one
        own = _open(path, files[comm.rank if same else 0], digests)
        if manifest["parallel"] == "data" and not same:
            _load_resharded(net, [own], whole=True)
        else:
            for layer in net.layers:
                pre = f"layer{layer.index}/"
                layer.load_state({k[len(pre):]: own[k] for k in own.files if k.startswith(pre)}, same_layout=True)
    else:
        sources = [_open(path, e, digests) for e in files]
        _load_resharded(net, sources, whole=False)
    net.step = int(manifest["step"])
    return manifest


def _load_resharded(net: Network, sources, whole: bool) -> None:
    """Each layer's slice [lo, hi) assembled from the old ranks' slices along the axes the
    layer names (`shard_axes`); arrays every rank holds alike come from the first file,
    and each layer rebuilds its own derived state."""
    for layer in net.layers:
        pre = f"layer{layer.index}/"
        if whole:
            bounds = np.array([0, layer.n])
        else:
            sizes = [src[pre + "b"].shape[0] for src in sources]
            bounds = np.concatenate(([0], np.cumsum(sizes)))
        arrays = {}
        for key, axis in layer.shard_axes().items():
            if pre + key not in sources[0].files:
                continue
            if axis is None:
                arrays[key] = np.asarray(sources[0][pre + key])
                continue
            parts = []
            for r, src in enumerate(sources):
                a, b = max(layer.lo, bounds[r]), min(layer.hi, bounds[r + 1])
                if a < b:
                    sl = [slice(None)] * src[pre + key].ndim
                    sl[axis] = slice(a - bounds[r], b - bounds[r])
                    parts.append(np.asarray(src[pre + key][tuple(sl)]))
            arrays[key] = np.concatenate(parts, axis=axis)
        layer.load_state(arrays, same_layout=False)


def _shape(layers: list[dict]) -> str:
    return " -> ".join(f"{l['n']}({l['kind']})" for l in layers)
