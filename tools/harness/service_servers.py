"""Real servers for the replica tests (and tools/bench/video_replicas_bench.py), each started on loopback and stopped
after them: a throwaway PostgreSQL cluster (Debian's `postgresql`), HAProxy (Debian's `haproxy`) and moto's standalone
S3 server (no S3 server installs from Debian or PyPI, so moto stands in as the endpoint of the boto3 code).

`make test` installs the two Debian packages. A server that cannot start fails the test with the reason: these are
the tests that prove the replicas work, and a skip would prove nothing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

INSTALL_HINT = "install Debian's postgresql and haproxy (make test does: apt-get install postgresql haproxy)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before listening on port {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"{what} did not listen on port {port} within {timeout_s:.0f} s")


def _postgres_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        pytest.fail(f"PostgreSQL's {name} was not found: {INSTALL_HINT}")
    return found


class PostgresServer:
    """A private cluster in a temporary directory on 127.0.0.1:<free port>, trust auth, fsync off (tests only).
    PostgreSQL refuses to run as root, so under root (CI) it runs as Debian's `postgres` user."""

    def __init__(self):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="telefuser-pg-"))
        self.data = self.dir / "data"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail(f"running as root needs the 'postgres' user that Debian's package creates: {INSTALL_HINT}")
            os.chown(self.dir, account.pw_uid, account.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run([_postgres_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   "--locale=C", "--no-sync"])  # fmt: skip
        self.start()

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(self._as_user + command, capture_output=True, text=True, cwd=self.dir, check=False)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(command[:2])} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c max_connections=200"
        )
        self._run([_postgres_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-o", options,
                   "-w", "-t", "30", "start"])  # fmt: skip

    def stop(self) -> None:
        self._run([_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class HAProxy:
    """`haproxy -f CONFIG` in the foreground; the config reads its addresses from the environment (${VAR})."""

    def __init__(self, config: Path, env: dict[str, str], port: int):
        binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
        if binary is None:
            pytest.fail(f"haproxy was not found: {INSTALL_HINT}")
        check = subprocess.run(
            [binary, "-c", "-f", str(config)], env={**os.environ, **env}, capture_output=True, check=False
        )
        if check.returncode != 0:
            pytest.fail(f"haproxy -c refused {config}: {check.stdout.decode()}{check.stderr.decode()}")
        self.port = port
        self.proc = subprocess.Popen(
            [binary, "-db", "-f", str(config)],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_for_port(port, self.proc, "haproxy")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class MotoS3:
    """moto's standalone server (`python -m moto.server`), an S3-compatible endpoint on 127.0.0.1."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.proc, "moto's S3 server")
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def new_bucket(self) -> str:
        import boto3

        name = f"videos-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=self.url, **_credentials(self.env)).create_bucket(Bucket=name)
        return name

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _credentials(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }
