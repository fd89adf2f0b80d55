"""``python -m service.settings_check``: read the ``LEAD_*`` settings once and say what is
wrong, with exit status 1.

``scripts/serve.sh`` and the Docker image run it before uvicorn: with ``LEAD_WORKERS`` > 1,
uvicorn's supervisor would restart workers that refuse the settings forever instead of
stopping. The device is checked too (``create_app`` refuses CUDA where there is none).
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

from service.loader import resolve_device
from service.settings import Settings

__all__ = ["main"]


def main() -> int:
    """Check the settings of the environment; 0 when the service can start with them."""
    try:
        resolve_device(Settings().device)
    except (ValidationError, RuntimeError) as exc:  # RuntimeError: CUDA asked for, none there
        sys.stderr.write(f"LEAD settings: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
