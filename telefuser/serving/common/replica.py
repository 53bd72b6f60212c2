"""A replica's name, the same rule for both services: it appears in URL paths (`/r/<replica>/...` behind the proxy),
in session ids and as the owner of a job's lease, so it is a short DNS-label-like token (a Kubernetes pod name
fits)."""

from __future__ import annotations

import argparse
import re

REPLICA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


def replica_id(text: str) -> str:
    """argparse type: a valid replica id or a usage error naming the rule."""
    if not REPLICA_ID.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a replica id: 1-63 letters, digits, '-' or '_', starting with a letter or digit"
        )
    return text
