"""Servers the replica tests share, started on first use and stopped when the session ends (tools/harness/service_servers.py)."""

from __future__ import annotations

import pytest

from tools.harness.service_servers import MotoS3, PostgresServer


@pytest.fixture(scope="session")
def postgres_server():
    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture
def job_database(postgres_server) -> str:
    """The URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.new_database()


@pytest.fixture(scope="session")
def moto_s3():
    server = MotoS3()
    yield server
    server.close()
