"""The one error the simulator raises on purpose: bad input, named by field or argument.

Non-goal: wrapping bugs. Anything else that escapes the simulator is a defect, not an input problem.
"""

from __future__ import annotations


class SimInputError(ValueError):
    """A cluster description, environment or call argument the simulator cannot use.

    ``str()`` is ``"<field>: <reason>"`` so a caller can show it as is.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")
