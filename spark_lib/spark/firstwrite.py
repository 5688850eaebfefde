"""The settings the JVM layer refuses at a job's first write, as data both sides read.

``first_write_rules.json`` (beside this module, and packed into the JVM layer's jar by its
build) lists each refused setting: its Spark conf key, the values refused (or the only ones
allowed), on which stores (``direct``: stores where files land under their final names, i.e.
every scheme but the rename stores'; ``any``), and the message. The JVM layer throws that
message at the first write (``io.sparkguard.spark.common.FirstWriteRules``); the operator's
admission refuses the app with the same message before it runs (:func:`refusals`), so an app
does not burn its retries to find out. :func:`refusals` is a purely computational function with
no side-effects besides reading the rules file once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

RULES_FILE: Final = Path(__file__).with_name("first_write_rules.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refusal:
    """One refused setting: the conf key and the message (which names the fix)."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@functools.cache
def _rules() -> Mapping[str, Any]:
    loaded: dict[str, Any] = json.loads(RULES_FILE.read_text(encoding="utf-8"))
    if loaded.get("version") != 1:
        raise ValueError(f"{RULES_FILE}: version {loaded.get('version')!r} is not known")
    return loaded


def writes_directly(url: str) -> bool:
    """Whether a table at ``url`` gets its files under their final names (an object store):
    every scheme but the rename stores' (local paths, ``hdfs``, ``viewfs``).

    A purely computational function with no side-effects.
    """
    return urlsplit(url).scheme.lower() not in _rules()["renameSchemes"]


def refusals(conf: Mapping[str, str], *, store: str, where: str | None = None) -> list[Refusal]:
    """What the JVM layer would refuse at the first write of a job with Spark conf ``conf``
    whose tables are on ``store`` (a URL: its scheme decides), with the JVM layer's messages;
    ``where`` names the table in them (default ``store``).

    A purely computational function with no side-effects.
    """
    direct = writes_directly(store)
    found: list[Refusal] = []
    for rule in _rules()["rules"]:
        if rule["stores"] == "direct" and not direct:
            continue
        raw = conf.get(rule["key"])
        value = (raw if raw is not None else rule["default"]).strip().lower()
        refused = value in rule.get("refused", ()) or (
            "allowed" in rule and value not in rule["allowed"]
        )
        if refused:
            message = rule["message"].replace("{where}", where or store).replace("{value}", value)
            found.append(Refusal(key=rule["key"], message=message))
    return found
