"""`python -m tests.stand_in_model.serve serve --model stand_in ...`: the telefuser command line with the stand-in
registered first."""

from __future__ import annotations

import sys

from telefuser.cli import main
from telefuser.models import registry

from .spec import STAND_IN

if __name__ == "__main__":
    registry.register(STAND_IN)
    sys.exit(main())
