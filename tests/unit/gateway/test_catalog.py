"""The model catalog: `[gateway.models.ALIAS]` tables checked at start-up, and `/v1/models` listing
every catalog model as ready on N boards or loadable (issue 20)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from calculet.common.errors import InvalidArgument
from calculet.gateway.api.app import create_app
from calculet.gateway.config import config_from, read_config
from calculet.gateway.fleet.catalog import CatalogModel, catalog_from
from calculet.gateway.serving.service import GatewayService
from tests.unit.gateway.fakes import ALIAS, FakeDaemon
from tests.unit.gateway.harness import serving


def test_a_config_file_declares_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[gateway]\ndaemons = ["unix:/b0.sock", "unix:/b1.sock"]\n'
        '[gateway.models.qwen]\npackage = "qwen"\nmin-boards = 1\nmax_boards = 2\npriority = 10\n'
        'pinned = ["unix:/b0.sock"]\n'
        '[gateway.models."qwen3-4b"]\npackage = "dense0"\n'
    )
    cfg = config_from(read_config(path))
    assert cfg.catalog == (
        CatalogModel("qwen", "qwen", min_boards=1, max_boards=2, priority=10, pinned=("unix:/b0.sock",)),
        CatalogModel("qwen3-4b", "dense0"),
    )


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ([], "table of"),
        ({"bad alias": {"package": "p"}}, "alias 'bad alias'"),
        ({"a": "p"}, "models.a: must be a table"),
        ({"a": {"package": "p", "replicas": 2}}, "models.a: unknown keys replicas"),
        ({"a": {}}, "models.a.package"),
        ({"a": {"package": ""}}, "models.a.package"),
        ({"a": {"package": "p", "min-boards": -1}}, "models.a.min-boards"),
        ({"a": {"package": "p", "min-boards": 1.5}}, "models.a.min-boards"),
        ({"a": {"package": "p", "max-boards": True}}, "models.a.max-boards"),
        ({"a": {"package": "p", "min-boards": 2, "max-boards": 1}}, "below min-boards 2"),
        ({"a": {"package": "p", "pinned": ["x", "y"], "max-boards": 1}}, "its 2 pinned"),
        ({"a": {"package": "p", "pinned": ["x", "x"]}}, "distinct board targets"),
        ({"a": {"package": "p", "pinned": ["x"]}, "b": {"package": "q", "pinned": ["x"]}}, "pinned to both a and b"),
    ],
)
def test_a_bad_catalog_is_refused_naming_the_alias_and_key(tables: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        catalog_from(tables)


def test_v1_models_lists_ready_and_loadable_models() -> None:
    catalog = (CatalogModel(ALIAS, "pkg-a", min_boards=1), CatalogModel("dense", "dense0"))

    def with_catalog(service: GatewayService) -> None:
        service.catalog = catalog

    with TestClient(create_app(serving(FakeDaemon("board-0"), FakeDaemon("board-1"), setup=with_catalog))) as client:
        data = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert set(data) == {ALIAS, "dense"}
    assert (data[ALIAS]["state"], data[ALIAS]["boards"]) == ("ready", 2) and data[ALIAS]["context_length"] > 0
    assert data["dense"] == {
        "id": "dense", "object": "model", "created": 0, "owned_by": "calculet", "boards": 0, "state": "loadable",
    }  # fmt: skip
