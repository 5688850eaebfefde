"""Durations as people write them: ``30s``, ``2m``, ``1h30m``, or whole seconds ``45``."""

from __future__ import annotations

import re
from typing import Final

_PART: Final = re.compile(r"(?P<amount>[0-9]+)(?P<unit>h|m|s)")
_WHOLE: Final = re.compile(r"^(?:[0-9]+(?:h|m|s))+$")
_SECONDS: Final = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: an integer (seconds) or units ``h``, ``m``, ``s`` (``1h30m``, ``90s``).

    A purely computational function with no side-effects. Raises ``ValueError`` with a message
    saying which forms are accepted.
    """
    value = text.strip()
    if value.isascii() and value.isdigit():
        return float(int(value))
    if not _WHOLE.fullmatch(value):
        raise ValueError(
            f"{text!r} is not a duration: write whole seconds ('45') or units h/m/s "
            "('30s', '2m', '1h30m')"
        )
    units = [m.group("unit") for m in _PART.finditer(value)]
    if len(units) != len(set(units)):
        raise ValueError(f"{text!r} repeats a unit: write each of h, m, s at most once")
    parts = _PART.finditer(value)
    return float(sum(int(m.group("amount")) * _SECONDS[m.group("unit")] for m in parts))


def format_duration(seconds: float) -> str:
    """``seconds`` written back in the shortest h/m/s form (``90`` -> ``1m30s``).

    A purely computational function with no side-effects.
    """
    total = round(seconds)
    if total == 0:
        return "0s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{amount}{unit}" for amount, unit in parts if amount)
