"""Tools beside a run: `train-head` (fit an attribute head), `token-prior` (unigram counts for
UDDIA's redo), and `launcher_check` (`python -m harness.tools.launcher_check CLUSTER.yaml`)."""

__all__ = ["launcher_check", "token_prior", "train_head"]
