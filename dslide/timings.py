"""The run's timings: one object of named accumulators of seconds.

The training loop owns it (`dslide.train.Model.timings`) and passes it down:
the network times the phases of a step, each layer its own queries and its
candidate source's upkeep, the synchronisation schedule its waits. Readers
take figures from it by name; nobody keeps seconds of their own. (The
communicator's per-collective seconds stay in `dslide.comm.Comm.seconds`.)

Names in use:

    forward, backward, lsh_upkeep, lsh_query   a training step's phases (Network.train_step;
                                                lsh_query: candidate queries of LSH layers)
    index_query                                 an LSH output layer's inference index queries
    predict_hidden, predict_output,             a prediction's stages (dslide.infer.predict): the
    predict_merge                               hidden layers, the output's top k (index_query
                                                within it), the merge over ranks
    fusion_neighbours, fusion_prototypes,       its fusion stage: the two searches of the
    fusion_fuse                                 neighbour store and the fusion kernel
    hidden_neighbours, hidden_fuse              its hidden neighbours' stage: their search and
                                                their votes' kernel (dslide.infer.hidden_knn)
    upkeep[l]                                   layer l's candidate source upkeep (tables built,
                                                refilled, rehashed; its first build included)
    sync_wait                                   synchronisations and global points of replicas
    train, warmup                               the loop: training time (evaluation excluded)
                                                and its compiling first step
"""

from __future__ import annotations

import time
from contextlib import contextmanager

#: the names of a training step's phases (what `Network.timers` reports)
STEP_PHASES = ("forward", "backward", "lsh_upkeep", "lsh_query")


def upkeep_name(layer: int) -> str:
    """The accumulator of layer `layer`'s candidate source upkeep."""
    return f"upkeep[{layer}]"


class Timings:
    """Seconds by name: `add(name, seconds)`, `with timings.time(name): ...`, `timings[name]`
    (0.0 for a name never added)."""

    def __init__(self):
        self._seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @contextmanager
    def time(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def __getitem__(self, name: str) -> float:
        return self._seconds.get(name, 0.0)

    def __contains__(self, name: str) -> bool:
        return name in self._seconds

    def items(self):
        return self._seconds.items()

    def subset(self, names) -> dict:
        """{name: seconds} of those of `names` ever added, in the order of `names`."""
        return {k: self._seconds[k] for k in names if k in self._seconds}
