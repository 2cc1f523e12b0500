"""Structured logs: one JSON object per line, with the trace identifiers of spec 24.2.

Enabled by ``QIM_LOG_FORMAT=json`` (``qim up`` sets it for every process it starts). Each line
has ``ts`` (UTC, ISO 8601 with ms), ``level``, ``process``, ``logger``, ``msg`` and, when the
record carries them (``extra={"trace": {...}}``, see :func:`trace`), the 24.2 identifiers as
top-level fields.

The trace id. 24.2 says the ConversationWriter generates ``trace_id`` at commit; no record of
ours has a field for it, so it is *derived*: ``trace_id`` is the 32 hex digits of the
``message_id`` the writer assigns at commit (6.2: unique, and carried by every later record:
outbox, GroupDispatch, mailbox entry, PUSH_EVENTS, SEND_ACK). Every process can compute it
without a new wire field. Before the commit (the gateway forwarding a SEND_MESSAGE) only the
``client_message_id`` is known; the writer's line carries both, which joins the two.

Sampling (24.2): 1 % of trace ids by hash; ``QIM_TRACE_SAMPLE_PERCENT`` (0-100) changes it.
The always-sample cases of 24.2 (ERROR replies, always-zero counters) are logged at warning
level by their own code paths. Never logged: tokens, cursor signatures, keys, payloads,
previews (24.2); :func:`trace` accepts identifiers only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "TRACE_FIELDS",
    "JsonFormatter",
    "RepeatFilter",
    "configure",
    "json_logging_config",
    "sampled",
    "trace",
    "trace_id_of",
    "wants_json",
]

TRACE_FIELDS: Final = (
    "trace_id", "tenant_id", "message_id", "event_id", "client_message_id", "conversation_id",
    "conversation_seq", "dispatch_id", "mailbox_shard", "lane_id", "mailbox_seq", "shard_epoch",
    "membership_version", "connection_shard", "connection_node_id", "mailbox_node_id",
    "device_id", "user_id", "stage",
)  # fmt: skip
"""The 24.2 identifiers (plus ``client_message_id``, ``user_id`` and the ``stage`` name)."""

_ALLOWED = frozenset(TRACE_FIELDS)


def trace_id_of(message_id: int | bytes) -> str:
    """The trace id of a message: its ``message_id`` as 32 hex digits (see the docstring)."""
    if isinstance(message_id, bytes):
        return message_id.hex().rjust(32, "0")
    return f"{message_id:032x}"


def sampled(trace_id: str, percent: float | None = None) -> bool:
    """Whether ``trace_id`` is in the sample: a stable hash, so every process agrees."""
    if percent is None:
        percent = float(os.environ.get("QIM_TRACE_SAMPLE_PERCENT", "1"))
    if percent >= 100:
        return True
    if percent <= 0:
        return False
    bucket = int.from_bytes(hashlib.blake2b(trace_id.encode(), digest_size=4).digest(), "big")
    return bucket % 10_000 < percent * 100


def trace(logger: logging.Logger, msg: str, *, percent: float | None = None, **ids: Any) -> bool:
    """Log one trace line (info) if the message's trace id is sampled; returns whether it was.

    ``ids`` must include ``message_id`` (int or bytes) or ``trace_id``; only the names of
    :data:`TRACE_FIELDS` are accepted, so a payload cannot end up in a log by mistake.
    """
    unknown = set(ids) - _ALLOWED
    if unknown:
        raise ValueError(f"not a trace field: {sorted(unknown)}")
    tid = ids.get("trace_id")
    if tid is None:
        tid = trace_id_of(ids["message_id"])
    if not sampled(tid, percent):
        return False
    fields = {"trace_id": tid, **{k: _plain(v) for k, v in ids.items() if k != "trace_id"}}
    logger.info(msg, extra={"trace": fields})
    return True


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, int) and value >= 1 << 63:
        return f"{value:032x}"  # message ids: JSON readers lose precision above 2**53
    return value


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "process", "logger", "msg", <trace fields>, "exc"}`` on one line."""

    def __init__(self, process: str = "", **kwargs: Any) -> None:
        super().__init__()
        self.process = process or os.environ.get("QIM_PROCESS_NAME", "") or "qim"

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname.lower(),
            "process": self.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "trace", None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"), default=str)


class RepeatFilter(logging.Filter):
    """Lets one line per (logger, level, text) through per ``window_s`` and counts the rest.

    During a broker outage the Kafka client logs the same connection error from every fetch,
    heartbeat and metadata attempt, thousands of lines a second per process; formatting them
    costs CPU the process needs when the broker returns, and buries the line that says why.
    The first line of a run passes; the next one after the window carries ``repeated`` = how
    many were held back. Only ``prefixes`` (the client libraries) are filtered: qim's own lines
    always pass.
    """

    def __init__(
        self,
        window_s: float = 1.0,
        prefixes: tuple[str, ...] = ("aiokafka", "kafka"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.window_s = window_s
        self.prefixes = prefixes
        self.clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self.clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.window_s:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.trace = {**getattr(record, "trace", {}), "repeated": last[1]}
        if len(self._seen) > 1024:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True


def wants_json(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("QIM_LOG_FORMAT", "").lower() == "json"


def json_logging_config(process: str, level: str = "INFO") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for stdout JSON lines (Faust's ``logging_config``)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter, "process": process}},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "filters": ["repeats"],
                "stream": "ext://sys.stdout",
            }
        },
        "filters": {"repeats": {"()": RepeatFilter}},
        "root": {"level": level, "handlers": ["default"]},
    }


def configure(process: str, level: int = logging.INFO) -> bool:
    """Outside Faust: JSON lines on stderr if ``QIM_LOG_FORMAT=json``; returns whether it did."""
    if not wants_json():
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return True
