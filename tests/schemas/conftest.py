"""A database of this test's own on the real engine, with every table, rollup and view the schemas describe."""

from __future__ import annotations

import pytest

from core.settings import CommonSettings
from sinks import store


@pytest.fixture
def db(clickhouse_url, clickhouse_database):
    cfg = CommonSettings(clickhouse_url=clickhouse_url, clickhouse_database=clickhouse_database)
    client = store.connect(cfg)
    store.apply_schema(client, cfg)
    yield client
    client.command(f"DROP DATABASE IF EXISTS {clickhouse_database}")
