"""Training: the loop and what it needs beyond the model.

`loop` is `fit`, the one training loop, and the run's `Model` (`build_network`,
`save_model`), with the trivial synchronisation schedule `Alone`; `replicas/`
the other schedule (replicas of the model over groups of ranks); `validation`
the held-out split, the epoch checks of early stopping and the fusion choice
made on that split; `infer_build` the model's inference parts, built at the
end of training (and the epoch checks' scorer).
"""

from dslide.train.loop import (STEP_KINDS, Alone, Model, TrainingDiverged, batch_rows, build_network,
                               checkpoint_steps, data_parallel_bytes, epoch_order, fit, format_record,
                               init_from_data, peak_rss_mb, rank_threads, save_model, throughput, total_steps)

__all__ = ["STEP_KINDS", "Alone", "Model", "TrainingDiverged", "batch_rows", "build_network", "checkpoint_steps",
           "data_parallel_bytes", "epoch_order", "fit", "format_record", "init_from_data", "peak_rss_mb",
           "rank_threads", "save_model", "throughput", "total_steps"]
