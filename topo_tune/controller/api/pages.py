"""Listings paged by bytes: a reply holds whole items up to about ``PAGE_BYTES``, and a token for the rest.

gRPC refuses a reply larger than the receiver's limit (4 MiB by default on a client), so a listing whose
items are large (a job comparison holds every node name and every run) is cut into pages by size, not only
by count. The page token is the sort key of the last item sent (created, id), so the next page starts after
it whatever was added meanwhile.

Non-goals: which items a listing holds (the services), following the pages (the client).
"""

from __future__ import annotations

from datetime import datetime

from topo_tune.errors import ValidationError
from topo_tune.jobs.compare.comparison_record import StoredComparison

PAGE_BYTES = 1 << 20
"""A page's items in bytes, at most (one larger item is sent alone)."""
_SEPARATOR = "|"


def to_page_token(last: StoredComparison) -> str:
    return f"{last.created_at.isoformat()}{_SEPARATOR}{last.id}"


def from_page_token(token: str) -> tuple[datetime, str] | None:
    """The (created, id) a page token names; None for the first page; ``ValidationError`` for a bad one."""
    if not token:
        return None
    created, separator, key = token.partition(_SEPARATOR)
    try:
        if not separator or not key or len(token) > 200:
            raise ValueError(token)
        return datetime.fromisoformat(created), key
    except ValueError:
        raise ValidationError("page_token", "not a token a previous reply gave") from None
