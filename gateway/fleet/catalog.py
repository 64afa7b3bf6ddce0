"""The model catalog: every model the fleet may serve, whether or not a board serves it now.

Owns the catalog's form and its checks. Operators write it into the gateway's TOML file, one
table per alias; `catalog_from` turns the tables into `CatalogModel`s or refuses the file, naming
the alias and key. `/v1/models` lists every catalog model with its state: ready on N boards, or
loadable. Placement by demand (docs/models.md) reads the bounds and priorities from here.

    [gateway.models.qwen]
    package = "qwen"            # package directory under the daemons' models root
    min-boards = 1              # never take this model below 1 board
    max-boards = 2              # never give it more than 2 (0: no limit)
    priority = 10               # who keeps a board when demand ties (higher wins)
    pinned = ["unix:/run/calculet/board0.sock"]   # boards only an operator may switch away
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calculet.common.aliases import check_alias
from calculet.common.errors import InvalidArgument

KEYS = frozenset({"package", "min-boards", "max-boards", "priority", "pinned"})
MAX_BOARDS = 10_000


@dataclass(frozen=True)
class CatalogModel:
    """One model of the catalog.

    Attributes:
        alias: the name clients ask for.
        package: its package directory, relative to the daemons' models root.
        min_boards: boards it keeps at least (placement never takes it below).
        max_boards: boards it gets at most; 0 = no limit.
        priority: higher keeps a board when demands tie.
        pinned: board targets that serve it and that placement never switches away.
    """

    alias: str
    package: str
    min_boards: int = 0
    max_boards: int = 0
    priority: int = 0
    pinned: tuple[str, ...] = ()


def catalog_from(tables: Any) -> tuple[CatalogModel, ...]:
    """The catalog of a `[gateway.models]` table (alias -> table), in alias order.

    Raises:
        InvalidArgument: not a table of tables, a bad alias, an unknown key, a missing or empty
            package, a count out of range, max-boards below min-boards or below the pinned boards,
            or one board pinned to two models.
    """
    if not isinstance(tables, Mapping):
        raise InvalidArgument("models: must be a table of [gateway.models.ALIAS] tables")
    catalog = tuple(_model(alias, table) for alias, table in sorted(tables.items()))
    owners: dict[str, str] = {}
    for model in catalog:
        for board in model.pinned:
            if board in owners:
                raise InvalidArgument(f"models: board {board} is pinned to both {owners[board]} and {model.alias}")
            owners[board] = model.alias
    return catalog


def _model(alias: Any, table: Any) -> CatalogModel:
    """Raises: InvalidArgument (see `catalog_from`), naming `models.ALIAS`."""
    if not isinstance(alias, str):
        raise InvalidArgument(f"models: alias {alias!r} is not a string")
    check_alias(alias)
    where = f"models.{alias}"
    if not isinstance(table, Mapping):
        raise InvalidArgument(f"{where}: must be a table")
    settings = {str(key).replace("_", "-"): value for key, value in table.items()}
    unknown = sorted(set(settings) - KEYS)
    if unknown:
        raise InvalidArgument(f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(KEYS))})")
    package = settings.get("package")
    if not isinstance(package, str) or not package:
        raise InvalidArgument(f"{where}.package: must be a non-empty path under the daemons' models root")
    pinned = settings.get("pinned", [])
    if (
        not isinstance(pinned, list)
        or not all(isinstance(b, str) and b for b in pinned)
        or len(set(pinned)) < len(pinned)
    ):
        raise InvalidArgument(f"{where}.pinned: must be a list of distinct board targets")
    model = CatalogModel(
        alias=alias,
        package=package,
        min_boards=_count(settings, "min-boards", where),
        max_boards=_count(settings, "max-boards", where),
        priority=_count(settings, "priority", where, low=-MAX_BOARDS),
        pinned=tuple(pinned),
    )
    if model.max_boards and model.max_boards < max(model.min_boards, len(model.pinned)):
        raise InvalidArgument(
            f"{where}.max-boards: {model.max_boards} is below min-boards {model.min_boards} "
            f"or its {len(model.pinned)} pinned board(s)"
        )
    return model


def _count(settings: Mapping[str, Any], key: str, where: str, low: int = 0) -> int:
    """Raises: InvalidArgument unless a whole number in [low, MAX_BOARDS]."""
    value = settings.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{where}.{key}: must be a whole number, got {value!r}")
    if value != int(value) or not low <= value <= MAX_BOARDS:
        raise InvalidArgument(f"{where}.{key}: must be a whole number in [{low}, {MAX_BOARDS}], got {value!r}")
    return int(value)
