"""LEAD: learn stitches between embedding spaces, score their alignment, translate vectors."""

from lead._apply import apply_stitch
from lead._version import __version__
from lead.alignment import alignment_scores
from lead.anchors import fit_anchors
from lead.artifacts import (
    load_stitch,
    push_stitch,
    read_stitch_config,
    save_stitch,
    stitch_folder,
)
from lead.crossfit import crossfit_retrieval
from lead.data import EmbeddingReader, EmbeddingWriter, read_embeddings
from lead.errors import LeadError
from lead.fitting import ProgressCallback, fit_procrustes, fit_ridge, fit_stitch
from lead.invertible import InvertibleConfig, train_invertible
from lead.metrics import (
    cknna_score,
    cycle_knn_score,
    linear_cka_score,
    mean_cosine_similarity,
    mean_rank_error,
    mean_squared_error,
    mutual_knn_score,
    pwcca_score,
    r2_score,
    svcca_score,
    top1_accuracy_score,
    unbiased_cka_score,
)
from lead.retrieval import ndcg_at_k_score, rank_corpus, recall_at_k_score, retrieval_scores
from lead.scorecard import RetrievalData, Scorecard, round_trip_scores, score_stitch
from lead.splits import holdout_split, kfold_indices
from lead.stitches import (
    STITCH_REGISTRY,
    AffineStitch,
    InvertibleStitch,
    MLPStitch,
    OrthogonalStitch,
    Stitch,
    StitchInfo,
    stitch_class,
)
from lead.training import MLPConfig, train_mlp
from lead.unsupervised import fit_unsupervised

__all__ = [
    "STITCH_REGISTRY",
    "AffineStitch",
    "EmbeddingReader",
    "EmbeddingWriter",
    "InvertibleConfig",
    "InvertibleStitch",
    "LeadError",
    "MLPConfig",
    "MLPStitch",
    "OrthogonalStitch",
    "ProgressCallback",
    "RetrievalData",
    "Scorecard",
    "Stitch",
    "StitchInfo",
    "__version__",
    "alignment_scores",
    "apply_stitch",
    "cknna_score",
    "crossfit_retrieval",
    "cycle_knn_score",
    "fit_anchors",
    "fit_procrustes",
    "fit_ridge",
    "fit_stitch",
    "fit_unsupervised",
    "holdout_split",
    "kfold_indices",
    "linear_cka_score",
    "load_stitch",
    "mean_cosine_similarity",
    "mean_rank_error",
    "mean_squared_error",
    "mutual_knn_score",
    "ndcg_at_k_score",
    "push_stitch",
    "pwcca_score",
    "r2_score",
    "rank_corpus",
    "read_embeddings",
    "read_stitch_config",
    "recall_at_k_score",
    "retrieval_scores",
    "round_trip_scores",
    "save_stitch",
    "score_stitch",
    "stitch_class",
    "stitch_folder",
    "svcca_score",
    "top1_accuracy_score",
    "train_invertible",
    "train_mlp",
    "unbiased_cka_score",
]
