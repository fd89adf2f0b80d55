"""``python -m service.openapi``: see :mod:`service.openapi.cli`."""

from service.openapi.cli import main

raise SystemExit(main())
