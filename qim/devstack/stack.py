"""The whole local system on loopback: Redis, Kafka, the topics, one worker of each app.

`qim up` / `qim down` / `qim status` and the test suite all go through `Stack`, so what the README
runs and what the tests run are the same processes started the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from qim.devstack import kafka, procs, redis
from qim.params import Settings
from qim.streams import ALL_TOPICS, TopicSpec, runtime

ROOT = kafka.ROOT
LOCAL_BASE_DIR: Final = ROOT / ".run"
"""The local stack's folder (`qim up`)."""


# Not in Appendix B: the design fixes no partition count for the conversation-side topics.
CONVERSATION_PARTITION_COUNT = 16
# Ours too: the key worker's request topic and its co-partitioned DevicePreKeyBundle table. Few
# partitions, since key traffic is rare (session setup, refills) and each is one RocksDB per table.
PREKEY_PARTITION_COUNT = 8


def prekey_partition_count() -> int:
    """``QIM_PREKEY_PARTITION_COUNT`` or PREKEY_PARTITION_COUNT (the same locally and in tests:
    key traffic is too rare for the count to matter to latency)."""
    return int(os.environ.get("QIM_PREKEY_PARTITION_COUNT", PREKEY_PARTITION_COUNT))


# Ours too: rooms are few and each costs a RoomWriter nothing when idle (topology.md).
ROOM_PARTITION_COUNT = 4


def default_partition_counts() -> dict[str, int]:
    """Partition counts of the declared topics: the shard counts come from qim.params."""
    params = Settings.load()
    return {
        "conversation_partition_count": int(
            os.environ.get("QIM_CONVERSATION_PARTITION_COUNT", CONVERSATION_PARTITION_COUNT)
        ),
        "mailbox_shard_count": params.mailbox_shard_count,
        "connection_shard_count": params.connection_shard_count,
        "single_partition": 1,
        "prekey_partition_count": prekey_partition_count(),
        "room_partition_count": room_partition_count(),
    }


# The local stack's counts (`qim up`, `scripts/run`), chosen by measurement (bench/README.md,
# issue 13, round 1 row E; topology.md decision 22): on one 2-core machine every consumer fetch
# round lists and the broker walks every partition it owns, so 4 / 8 / 16 partitions instead of
# 16 / 64 / 256 cut SEND_ACK p99 at 100 msg/s 2.5-5x. connection_shard_count stays a multiple of
# mailbox_shard_count (spec 5.2); the virtual bucket and lane counts do not change.
LOCAL_PARTITION_COUNTS: Final = {
    "conversation_partition_count": 4,
    "mailbox_shard_count": 8,
    "connection_shard_count": 16,
}
PARTITION_ENV: Final = {
    "conversation_partition_count": "QIM_CONVERSATION_PARTITION_COUNT",
    "mailbox_shard_count": "QIM_MAILBOX_SHARD_COUNT",
    "connection_shard_count": "QIM_CONNECTION_SHARD_COUNT",
}
PARTITIONS_FILE: Final = "partitions.json"
"""Under the stack folder: the counts its topics were created with, and its Kafka bootstrap."""


def local_partition_counts() -> dict[str, int]:
    """The local stack's counts: LOCAL_PARTITION_COUNTS, each overridden by its environment
    variable (validated like any parameter: powers of two, the 5.2 multiple)."""
    counts = {
        name: int(os.environ.get(var, LOCAL_PARTITION_COUNTS[name]))
        for name, var in PARTITION_ENV.items()
    }
    Settings.load(
        overrides={
            "mailbox_shard_count": counts["mailbox_shard_count"],
            "connection_shard_count": counts["connection_shard_count"],
        }
    )
    return {
        **counts,
        "single_partition": 1,
        "prekey_partition_count": prekey_partition_count(),
        "room_partition_count": room_partition_count(),
    }


def room_partition_count() -> int:
    """``qim.room-requests`` / ``qim.room-log``: ``QIM_ROOM_PARTITION_COUNT``, 4 by default.
    Not recorded with the other counts: the RoomWriter and the admin plane read the topic's
    own count, and only the gateways are told (``StackConfig.env``)."""
    return int(os.environ.get("QIM_ROOM_PARTITION_COUNT", ROOM_PARTITION_COUNT))


def recorded_partitions(base_dir: Path) -> dict[str, Any] | None:
    """What ``qim up`` wrote under ``base_dir`` (None: no stack was created there)."""
    try:
        data = json.loads((base_dir / PARTITIONS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def adopt_local_stack(base_dir: Path, environ: dict[str, str] | Any = os.environ) -> None:
    """Make a ``qim`` command agree with the local stack it talks to.

    Every process of the stack gets the counts in its environment (``StackConfig.env``); a
    command run from a shell (``qim bench``, ``qim replay``, ``qim audit``) gets them here, from
    the stack folder, unless it targets another Kafka (``QIM_KAFKA_BOOTSTRAP`` set to something
    else, e.g. a test's private stack). A variable set to a different value is refused: the
    topics exist with the recorded counts, and a command using others would route wrongly.
    """
    rec = recorded_partitions(base_dir)
    if rec is None:
        return
    bootstrap = environ.get("QIM_KAFKA_BOOTSTRAP")
    if bootstrap is not None and bootstrap != rec.get("bootstrap"):
        return
    for name, var in PARTITION_ENV.items():
        want = str(rec["counts"][name])
        have = environ.get(var)
        if have is None:
            environ[var] = want
        elif have != want:
            raise ValueError(
                f"{var}={have}, but the local stack under {base_dir} was created with {want}; "
                "unset it, or `qim down` and remove that folder to start over with other counts"
            )


@dataclass(frozen=True)
class WorkerSpec:
    """One `faust worker` process of one app module."""

    name: str
    module: str
    web_port: int


@dataclass(frozen=True)
class GatewaySpec:
    """One `qim gateway` (ConnectionNode): plain ws, allowed on loopback only, and /metrics."""

    name: str = "gw-1"
    ws_port: int = 18080
    metrics_port: int = 18081

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}/"


@dataclass(frozen=True)
class AdminSpec:
    """The group admin endpoint (`qim admin serve`): the trusted plane's GroupAdd/GroupRemove."""

    name: str = "admin-1"
    port: int = 16091
    dev_web_port: int | None = 18090
    """The browser chat client and /dev/token (qim.admin.devweb); None = not served."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str | None:
        return None if self.dev_web_port is None else f"http://127.0.0.1:{self.dev_web_port}/"


@dataclass(frozen=True)
class PushStandinSpec:
    """The APNs (HTTP/2, production and sandbox) and FCM stand-ins (`qim push-standins`)."""

    name: str = "push-standins"
    apns_port: int = 16443
    apns_sandbox_port: int = 16444
    fcm_port: int = 16445

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.fcm_port}/control"


@dataclass(frozen=True)
class StackConfig:
    base_dir: Path = LOCAL_BASE_DIR
    kafka_port: int = 19092
    controller_port: int = 19093
    redis_port: int = 16379
    kafka_heap_mb: int = 512
    partition_counts: dict[str, int] = field(default_factory=lambda: local_partition_counts())
    workers: tuple[WorkerSpec, ...] = (
        WorkerSpec("conversation-1", "qim.apps.conversation", 16066),
        WorkerSpec("mailbox-1", "qim.apps.mailbox", 16067),
        WorkerSpec("notify-1", "qim.apps.notify", 16068),
        WorkerSpec("keys-1", "qim.apps.keys", 16069),
        WorkerSpec("rooms-1", "qim.apps.rooms", 16070),
    )
    gateways: tuple[GatewaySpec, ...] = (GatewaySpec(),)
    admins: tuple[AdminSpec, ...] = (AdminSpec(),)
    push_standins: PushStandinSpec = PushStandinSpec()
    mailbox_checkpoints: bool = True
    """Ship MailboxShard checkpoints to ``<base_dir>/mailbox-checkpoints`` (19.3; the local
    stand-in for object storage). Test stacks leave it off: their tests start and wipe
    mailbox workers of their own, and the checkpoint tests set it per worker."""

    @property
    def kafka(self) -> kafka.KafkaConfig:
        return kafka.KafkaConfig(
            base_dir=self.base_dir / "kafka",
            port=self.kafka_port,
            controller_port=self.controller_port,
            heap_mb=self.kafka_heap_mb,
        )

    @property
    def redis(self) -> redis.RedisConfig:
        return redis.RedisConfig(base_dir=self.base_dir / "redis", port=self.redis_port)

    def env(self) -> dict[str, str]:
        """What every qim process of this stack gets in its environment."""
        return {
            "QIM_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "QIM_REDIS_URL": self.redis.url,
            # The development signing keys: `qim token issue` and the gateways share them.
            "QIM_AUTH_KEYS_FILE": str(self.base_dir / "auth-keys"),
            "QIM_CURSOR_KEYS_FILE": str(self.base_dir / "cursor-keys"),
            **{var: str(self.partition_counts[name]) for name, var in PARTITION_ENV.items()},
            "QIM_PREKEY_PARTITION_COUNT": str(self.partition_counts["prekey_partition_count"]),
            "QIM_ROOM_PARTITION_COUNT": str(
                self.partition_counts.get("room_partition_count", ROOM_PARTITION_COUNT)
            ),
            "QIM_ADMIN_URL": self.admins[0].url if self.admins else "",
            "QIM_ADMIN_SECRET": self.admin_secret(),
            # one JSON object per log line (qim.observability.logging)
            "QIM_LOG_FORMAT": "json",
            # the NotificationService's token sealing keys and its providers -> the stand-ins
            "QIM_PUSH_TOKEN_KEYS_FILE": str(self.base_dir / "push-token-keys"),
            **self.push_env(),
            **(
                {"QIM_MAILBOX_CHECKPOINT_DIR": str(self.base_dir / "mailbox-checkpoints")}
                if self.mailbox_checkpoints
                else {}
            ),
        }

    def push_env(self) -> dict[str, str]:
        from qim.devstack.push_standins import DevPushCredentials

        p = self.push_standins
        return DevPushCredentials(self.base_dir / "push").env(
            apns_port=p.apns_port, apns_sandbox_port=p.apns_sandbox_port, fcm_port=p.fcm_port
        )

    def admin_secret(self) -> str:
        """The development admin secret, made once under the stack folder (never a default)."""
        path = self.base_dir / "admin-secret"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def for_tests(self, base_dir: Path) -> StackConfig:
        """A private stack on free ports, so tests never touch a developer's running stack."""
        return replace(
            self,
            base_dir=base_dir,
            mailbox_checkpoints=False,
            # the parameters' defaults: the suite's in-process components load the same ones
            partition_counts=default_partition_counts(),
            kafka_port=procs.free_port(),
            controller_port=procs.free_port(),
            redis_port=procs.free_port(),
            workers=tuple(replace(w, web_port=procs.free_port()) for w in self.workers),
            gateways=tuple(
                replace(g, ws_port=procs.free_port(), metrics_port=procs.free_port())
                for g in self.gateways
            ),
            admins=tuple(
                replace(a, port=procs.free_port(), dev_web_port=procs.free_port())
                for a in self.admins
            ),
            push_standins=replace(
                self.push_standins,
                apns_port=procs.free_port(),
                apns_sandbox_port=procs.free_port(),
                fcm_port=procs.free_port(),
            ),
        )


async def ensure_topics(
    bootstrap: str, specs: tuple[TopicSpec, ...], counts: dict[str, int]
) -> list[str]:
    """Create the declared topics that do not exist yet; return the names created."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(s.name, s.partitions(counts), 1, topic_configs=s.config())
            for s in specs
            if s.name not in existing
        ]
        if new:
            await admin.create_topics(new)
            await wait_topics_visible(admin, {t.name: t.num_partitions for t in new})
        return [t.name for t in new]
    finally:
        await admin.close()


async def wait_topics_visible(
    admin: Any, partitions: dict[str, int], timeout_s: float = 30
) -> None:
    """Wait until the broker's metadata lists each topic with all partitions led.

    Consumers that join a group before that point can get an empty assignment.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        described = await admin.describe_topics(list(partitions))
        ready = {
            d["topic"]
            for d in described
            if d.get("error_code") == 0
            and len([p for p in d.get("partitions", ()) if p.get("leader", -1) >= 0])
            == partitions[d["topic"]]
        }
        if ready == set(partitions):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"topics not visible in metadata: {set(partitions) - ready}")
        await asyncio.sleep(0.1)


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def worker_health(port: int) -> dict[str, Any] | None:
    """The worker's `/healthz` answer (200 ready, 503 not ready), or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return _json_object(resp.read())
    except urllib.error.HTTPError as err:
        return _json_object(err.read())
    except OSError:
        return None


def worker_argv(module: str, datadir: Path, web_port: int) -> list[str]:
    """`faust -A <module> worker` with web on loopback (`--datadir` must precede `worker`)."""
    return [
        sys.executable, "-m", "faust", "-A", module, "--loop", runtime.event_loop_name(),
        "--datadir", str(datadir), "--loglevel", "info", "worker",
        "--web-bind", "127.0.0.1", "--web-host", "127.0.0.1", "--web-port", str(web_port),
    ]  # fmt: skip


def wait_worker_ready(
    port: int, pid: int, log_file: Path, *, timeout_s: float, what: str, key: str = "worker_ready"
) -> None:
    """Wait for ``/healthz``'s ``key``: ``worker_ready`` (Faust started, tables recovered) by
    default; ``ready`` also waits for the services (partitions restored, lanes caught up),
    which a test that holds a lane below its floor on purpose would never see."""

    def ready() -> bool:
        h = worker_health(port)
        return bool(h and h.get(key))

    try:
        procs.wait_until(
            ready,
            timeout_s=timeout_s,
            what=what,
            interval_s=0.2,
            alive=lambda: procs.pid_alive(pid),
        )
    except (TimeoutError, RuntimeError) as exc:
        raise RuntimeError(f"{exc}\n{procs.tail(log_file, 60)}") from exc


class Stack:
    def __init__(self, cfg: StackConfig | None = None) -> None:
        self.cfg = cfg or StackConfig()

    def _worker_dir(self, w: WorkerSpec) -> Path:
        return self.cfg.base_dir / "workers" / w.name

    def start_services(self) -> None:
        """Redis and Kafka, then the declared topics."""
        redis.start(self.cfg.redis)
        kafka.start(self.cfg.kafka)
        asyncio.run(ensure_topics(self.cfg.kafka.bootstrap, ALL_TOPICS, self.cfg.partition_counts))

    def start_worker(self, w: WorkerSpec, *, timeout_s: float = 120.0) -> None:
        wdir = self._worker_dir(w)
        pid_file, log_file = wdir / "worker.pid", wdir / "worker.log"
        pid = procs.read_pid(pid_file)
        if pid is None:
            argv = worker_argv(w.module, wdir / "data", w.web_port)
            env = {**os.environ, **self.cfg.env()}
            pid = procs.spawn(argv, pid_file=pid_file, log_file=log_file, cwd=ROOT, env=env)
        wait_worker_ready(
            w.web_port, pid, log_file, timeout_s=timeout_s, what=f"{w.name} ready", key="ready"
        )

    def stop_worker(self, w: WorkerSpec) -> bool:
        return procs.stop_pid(self._worker_dir(w) / "worker.pid", timeout_s=30.0)

    def _gateway_dir(self, g: GatewaySpec) -> Path:
        return self.cfg.base_dir / "gateways" / g.name

    def start_gateway(self, g: GatewaySpec, *, timeout_s: float = 60.0) -> None:
        """A ConnectionNode with the real AuthService (Redis) and shard ownership (Kafka)."""
        gdir = self._gateway_dir(g)
        pid_file, log_file = gdir / "gateway.pid", gdir / "gateway.log"
        argv = [
            "gateway", "--node-id", g.name,
            "--ws-port", str(g.ws_port), "--metrics-port", str(g.metrics_port),
            "--advertise", g.url,
        ]  # fmt: skip
        self._run_listener(g.name, argv, pid_file, log_file, g.ws_port, timeout_s)

    def stop_gateway(self, g: GatewaySpec) -> bool:
        return procs.stop_pid(self._gateway_dir(g) / "gateway.pid", timeout_s=30.0)

    def _admin_dir(self, a: AdminSpec) -> Path:
        return self.cfg.base_dir / "admin" / a.name

    def start_admin(self, a: AdminSpec, *, timeout_s: float = 60.0) -> None:
        adir = self._admin_dir(a)
        pid_file, log_file = adir / "admin.pid", adir / "admin.log"
        argv = ["admin", "serve", "--port", str(a.port), "--node-id", a.name]
        if a.dev_web_port is not None and self.cfg.gateways:
            argv += ["--dev-web-port", str(a.dev_web_port), "--gateway-url"]
            argv += [self.cfg.gateways[0].url]
        self._run_listener(a.name, argv, pid_file, log_file, a.port, timeout_s)

    def _run_listener(
        self,
        name: str,
        qim_args: list[str],
        pid_file: Path,
        log_file: Path,
        port: int,
        timeout_s: float,
    ) -> None:
        """Start `qim <qim_args>` unless its pid file names a live process; wait for its port."""
        pid = procs.read_pid(pid_file)
        if pid is None:
            argv = [sys.executable, "-m", "qim.cli", *qim_args]
            env = {**os.environ, **self.cfg.env()}
            pid = procs.spawn(argv, pid_file=pid_file, log_file=log_file, cwd=ROOT, env=env)
        started = pid
        try:
            procs.wait_until(
                lambda: procs.port_open("127.0.0.1", port),
                timeout_s=timeout_s,
                what=f"{name} listening",
                alive=lambda: procs.pid_alive(started),
            )
        except (TimeoutError, RuntimeError) as exc:
            raise RuntimeError(f"{exc}\n{procs.tail(log_file, 60)}") from exc

    def stop_admin(self, a: AdminSpec) -> bool:
        return procs.stop_pid(self._admin_dir(a) / "admin.pid", timeout_s=30.0)

    def _standins_dir(self) -> Path:
        return self.cfg.base_dir / "push"

    def start_push_standins(self, *, timeout_s: float = 60.0) -> None:
        """The APNs and FCM stand-ins; they make the development push credentials first."""
        from qim.devstack.push_standins import ensure_dev_credentials

        p = self.cfg.push_standins
        ensure_dev_credentials(self._standins_dir(), fcm_port=p.fcm_port)
        argv = [
            "push-standins", "--base", str(self._standins_dir()),
            "--apns-port", str(p.apns_port), "--apns-sandbox-port", str(p.apns_sandbox_port),
            "--fcm-port", str(p.fcm_port),
        ]  # fmt: skip
        d = self._standins_dir()
        self._run_listener(
            p.name, argv, d / "standins.pid", d / "standins.log", p.fcm_port, timeout_s
        )

    def stop_push_standins(self) -> bool:
        return procs.stop_pid(self._standins_dir() / "standins.pid", timeout_s=30.0)

    def up(self) -> None:
        self.record_partitions()
        self.start_services()
        self.start_push_standins()
        for w in self.cfg.workers:
            self.start_worker(w)
        for g in self.cfg.gateways:
            self.start_gateway(g)
        for a in self.cfg.admins:
            self.start_admin(a)

    def record_partitions(self) -> None:
        """Write the counts the topics get, or refuse counts other than an existing stack's."""
        counts = {name: self.cfg.partition_counts[name] for name in PARTITION_ENV}
        rec = recorded_partitions(self.cfg.base_dir)
        if rec is not None and (self.cfg.base_dir / "kafka").exists() and rec["counts"] != counts:
            raise RuntimeError(
                f"the stack under {self.cfg.base_dir} was created with {rec['counts']}, not "
                f"{counts}: its topics keep their partitions; `qim down` and remove that folder "
                "to start over with other counts"
            )
        self.cfg.base_dir.mkdir(parents=True, exist_ok=True)
        body = {"counts": counts, "bootstrap": self.cfg.kafka.bootstrap}
        (self.cfg.base_dir / PARTITIONS_FILE).write_text(json.dumps(body, indent=2) + "\n")

    def down(self) -> None:
        for a in self.cfg.admins:
            self.stop_admin(a)
        for g in self.cfg.gateways:
            self.stop_gateway(g)
        for w in self.cfg.workers:
            self.stop_worker(w)
        self.stop_push_standins()
        kafka.stop(self.cfg.kafka)
        redis.stop(self.cfg.redis)

    def status(self) -> dict[str, Any]:
        workers = {}
        for w in self.cfg.workers:
            alive = procs.read_pid(self._worker_dir(w) / "worker.pid") is not None
            workers[w.name] = {
                "running": alive,
                "health": worker_health(w.web_port) if alive else None,
                "metrics": f"http://127.0.0.1:{w.web_port}/metrics",
            }
        gateways = {
            g.name: {
                "running": procs.read_pid(self._gateway_dir(g) / "gateway.pid") is not None,
                "url": g.url,
                "listening": procs.port_open("127.0.0.1", g.ws_port),
                "metrics": f"http://127.0.0.1:{g.metrics_port}/metrics",
            }
            for g in self.cfg.gateways
        }
        admins = {
            a.name: {
                "running": procs.read_pid(self._admin_dir(a) / "admin.pid") is not None,
                "url": a.url,
                "listening": procs.port_open("127.0.0.1", a.port),
            }
            for a in self.cfg.admins
        }
        return {
            "kafka": {
                "running": kafka.is_running(self.cfg.kafka),
                "bootstrap": self.cfg.kafka.bootstrap,
                "answers_metadata": kafka.metadata_ok("127.0.0.1", self.cfg.kafka_port),
            },
            "redis": {
                "running": redis.is_running(self.cfg.redis),
                "url": self.cfg.redis.url,
                "answers_ping": redis.ping(self.cfg.redis_port),
            },
            "workers": workers,
            "gateways": gateways,
            "admins": admins,
        }
