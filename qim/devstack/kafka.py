"""A single-node Apache Kafka broker in KRaft mode, run from Maven Central jars.

Why jars and not a tarball: the machines reach Maven Central but no other download site, so the
broker's classpath is resolved by `mvn dependency:copy-dependencies` from `deploy/kafka/pom.xml`
into a git-ignored cache, and the broker is started with `kafka.Kafka` after a storage format step.
"""

from __future__ import annotations

import base64
import shutil
import socket
import struct
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from qim.devstack import procs

KAFKA_VERSION = "4.1.1"
ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "deploy" / "kafka" / "pom.xml"
DEFAULT_LIBS = ROOT / ".cache" / "kafka" / f"libs-{KAFKA_VERSION}"


def ensure_jars(libs: Path = DEFAULT_LIBS) -> Path:
    """Resolve the broker classpath once; later calls find the marker file and return at once."""
    marker = libs / ".complete"
    if marker.exists():
        return libs
    if shutil.which("mvn") is None:
        raise RuntimeError("mvn is not on PATH: Maven is needed to fetch the Kafka broker jars")
    tmp = libs.with_name(libs.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [
        "mvn", "-q", "-B", "-f", str(POM),
        "dependency:copy-dependencies", f"-DoutputDirectory={tmp}",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"fetching Kafka jars failed:\n{result.stdout}\n{result.stderr}")
    if not any(tmp.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        raise RuntimeError(f"mvn finished but kafka_2.13-{KAFKA_VERSION}.jar is missing in {tmp}")
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    marker.write_text(KAFKA_VERSION + "\n")
    return libs


@dataclass(frozen=True)
class KafkaConfig:
    """Where one broker lives: its folder, its two loopback ports and its heap."""

    base_dir: Path
    port: int = 19092
    controller_port: int = 19093
    heap_mb: int = 512
    libs: Path = DEFAULT_LIBS

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def pid_file(self) -> Path:
        return self.base_dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "kafka.out"


def _server_properties(cfg: KafkaConfig) -> str:
    # Small-machine values: 2 network/io threads, few internal partitions, no auto-created topics
    # (every topic is declared in qim.streams and created explicitly with its cleanup policy).
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cfg.controller_port}
listeners=PLAINTEXT://127.0.0.1:{cfg.port},CONTROLLER://127.0.0.1:{cfg.controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{cfg.port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={cfg.data_dir}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
num.partitions=1
auto.create.topics.enable=false
log.cleaner.dedupe.buffer.size=16777216
log.segment.bytes=67108864
"""


def server_properties(cfg: KafkaConfig) -> str:
    """The broker's ``server.properties``; the suite's container backend reuses it."""
    return _server_properties(cfg)


def _log4j2_properties(cfg: KafkaConfig) -> str:
    return f"""\
status = warn
appender.f.type = File
appender.f.name = F
appender.f.fileName = {cfg.base_dir / "server.log"}
appender.f.layout.type = PatternLayout
appender.f.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.f.ref = F
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def _java_cp(cfg: KafkaConfig) -> str:
    return f"{cfg.libs}/*"


def new_cluster_id() -> str:
    """A 22-character base64url UUID, as Kafka's own `random-uuid`; never starting with "-",
    which the storage tool's argument parser would take for an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _format_storage(cfg: KafkaConfig) -> None:
    """Format the KRaft log dir once; the cluster id is kept so restarts keep their data."""
    cid_file = cfg.base_dir / "cluster.id"
    if not cid_file.exists():
        cid_file.write_text(new_cluster_id())
    cmd = [
        "java", "-cp", _java_cp(cfg), "kafka.tools.StorageTool", "format",
        "-t", cid_file.read_text().strip(), "-c", str(cfg.base_dir / "server.properties"),
        "--ignore-formatted",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"kafka storage format failed:\n{result.stdout}\n{result.stderr}")


def metadata_ok(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when the broker answers a Metadata request that lists at least one broker.

    A raw Metadata v1 request (api key 3) keeps this check free of client-library state.
    """
    client_id = b"qim-devstack"
    body = struct.pack(">hhih", 3, 1, 7, len(client_id)) + client_id + struct.pack(">i", -1)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            head = _recv_exact(s, 12)
            _size, corr, n_brokers = struct.unpack(">iii", head)
            return bool(corr == 7 and n_brokers >= 1)
    except (OSError, struct.error):
        return False


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf


def is_running(cfg: KafkaConfig) -> bool:
    return procs.read_pid(cfg.pid_file) is not None


def start(cfg: KafkaConfig, *, timeout_s: float = 90.0) -> None:
    """Start the broker unless it already runs; return once it answers metadata requests."""
    cfg.base_dir.mkdir(parents=True, exist_ok=True)
    if is_running(cfg):
        procs.wait_until(
            lambda: metadata_ok("127.0.0.1", cfg.port),
            timeout_s=timeout_s,
            what="Kafka metadata",
        )
        return
    if procs.port_open("127.0.0.1", cfg.port):
        raise RuntimeError(f"port {cfg.port} is taken by a process this stack did not start")
    ensure_jars(cfg.libs)
    (cfg.base_dir / "server.properties").write_text(_server_properties(cfg))
    (cfg.base_dir / "log4j2.properties").write_text(_log4j2_properties(cfg))
    _format_storage(cfg)
    argv = [
        "java", f"-Xms{min(256, cfg.heap_mb)}m", f"-Xmx{cfg.heap_mb}m",
        "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile=file:{cfg.base_dir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={cfg.base_dir / 'logs'}",
        "-cp", _java_cp(cfg), "kafka.Kafka", str(cfg.base_dir / "server.properties"),
    ]  # fmt: skip
    pid = procs.spawn(argv, pid_file=cfg.pid_file, log_file=cfg.log_file)
    try:
        procs.wait_until(
            lambda: metadata_ok("127.0.0.1", cfg.port),
            timeout_s=timeout_s,
            what="Kafka metadata",
            alive=lambda: procs.pid_alive(pid),
        )
    except (TimeoutError, RuntimeError) as exc:
        log = procs.tail(cfg.base_dir / "server.log") + "\n" + procs.tail(cfg.log_file)
        stop(cfg)
        raise RuntimeError(f"Kafka did not start: {exc}\n{log}") from exc


def stop(cfg: KafkaConfig) -> bool:
    return procs.stop_pid(cfg.pid_file, timeout_s=30.0)
