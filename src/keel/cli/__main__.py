"""`python -m keel.cli ...` (same as the `keel` command)."""

from __future__ import annotations

import sys

from keel.cli import main

sys.exit(main())
