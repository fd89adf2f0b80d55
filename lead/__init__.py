"""LEAD: learn stitches between embedding spaces, score their alignment, translate vectors."""

from lead.errors import LeadError
from lead.stitches import (
    STITCH_REGISTRY,
    AffineStitch,
    MLPStitch,
    OrthogonalStitch,
    Stitch,
    StitchInfo,
    stitch_class,
)

__version__ = "0.1.0"

__all__ = [
    "STITCH_REGISTRY",
    "AffineStitch",
    "LeadError",
    "MLPStitch",
    "OrthogonalStitch",
    "Stitch",
    "StitchInfo",
    "__version__",
    "stitch_class",
]
