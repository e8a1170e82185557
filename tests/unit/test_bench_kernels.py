"""scripts/bench_kernels.py: each checkout's kernels timed in a process of its own, and their
outputs compared by digest (a checkout that computes other figures is flagged)."""

from pathlib import Path

from scripts import bench_kernels as BK

ROOT = Path(__file__).resolve().parents[2]


def test_two_runs_of_one_checkout_give_the_same_results_and_a_row_per_kernel(capsys):
    assert BK.main(["--repo", f"{ROOT}=again", "--reps", "1", "--no-record"]) == 0
    rows = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| again") or l.startswith("| this")]
    assert len(rows) == 32  # 16 kernels x 2 checkouts
    assert all(r.rstrip(" |").endswith("yes") for r in rows)
    assert {r.split("|")[2].strip() for r in rows} == {"scores_topk, k = 5", "scores_topk, k = 100", "flush_sum_rows",
                                                       "blocked_topk, k = 100", "shared_sample", "group_by_row",
                                                       "adam_rows", "rows_grad_adam", "fuse_grid_hits",
                                                       "the prior shifts' scorings, 3 x k = 100",
                                                       "softmax_stats (float32)"}


def test_a_different_result_is_flagged(monkeypatch):
    """The digest is of the outputs: a kernel returning other scores is not 'the same results'."""
    import numpy as np

    from dslide.model import topk

    real = BK.worker(1)
    monkeypatch.setattr(topk, "scores_topk", lambda S, k, lo: (np.zeros((S.shape[0], k)), np.zeros((S.shape[0], k), np.int64)))
    fake = BK.worker(1)
    assert [r["digest"] for r in real][:2] != [r["digest"] for r in fake][:2]
    assert [r["digest"] for r in real][2:] == [r["digest"] for r in fake][2:]
