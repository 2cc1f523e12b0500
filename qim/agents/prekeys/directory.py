"""One prekey request in, the row to store and the records to send out (the agent's one call).

The Faust agent (``qim.apps.keys``) reads ``qim.prekey-requests`` one record at a time (one
actor: every request of a partition is applied in log order by the partition's one owner), calls
:meth:`PreKeyDirectory.handle` with the owner's current table row, writes the returned row into
the ``DevicePreKeyBundle`` table, **waits until the changelog write is acknowledged** (acks=all)
and only then produces the replies. So a one-time prekey leaves the server only once its removal
is durable: a crash before the ack re-reads the request (at-least-once) and hands the same key
to the same request again, never to another one.

Configuration (environment of the key worker):

* ``QIM_PREKEY_NO_FALLBACK_TENANTS`` -- comma-separated tenants whose policy forbids the
  SignedPreKey fallback (A.6 #16): a fetch of a device with no one-time key left is
  ``PREKEY_EXHAUSTED`` for them; everyone else gets the SignedPreKey with
  ``one_time_exhausted=true``. The documents name the policy but no parameter, so it is a
  worker option, not an Appendix B row;
* ``e2ee_prekey_low_watermark`` (B.6.1, 20) comes from ``qim.params`` (``QIM_<PARAM>``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from qim.core.e2ee.prekeys import (
    Refusal,
    UserBundles,
    check_publish,
    decode_user_bundles,
    encode_user_bundles,
    fetch,
    own_status,
    publish,
)
from qim.params import Settings
from qim.schemas.frames import Error, PrekeyFetchDown
from qim.schemas.records.prekeys import PrekeyFetchRequest, PrekeyReply, PrekeyRequest
from qim.schemas.routing import connection_shard_id, user_bucket

__all__ = ["Handled", "PreKeyDirectory", "PreKeyOptions"]


@dataclass(frozen=True)
class PreKeyOptions:
    low_watermark: int = 20
    no_fallback_tenants: frozenset[str] = frozenset()
    virtual_bucket_count: int = 65536
    connection_shard_count: int = 256

    @classmethod
    def load(cls, settings: Settings, env: Mapping[str, str]) -> PreKeyOptions:
        raw = env.get("QIM_PREKEY_NO_FALLBACK_TENANTS", "")
        return cls(
            low_watermark=int(settings.e2ee_prekey_low_watermark),
            no_fallback_tenants=frozenset(t.strip() for t in raw.split(",") if t.strip()),
            virtual_bucket_count=int(settings.virtual_bucket_count),
            connection_shard_count=int(settings.connection_shard_count),
        )


@dataclass(frozen=True, slots=True)
class Handled:
    """``store``: the owner's new row (None: unchanged); ``replies`` go to ``qim.to-gateway``."""

    store: bytes | None
    replies: tuple[PrekeyReply, ...] = ()


@dataclass
class PreKeyDirectory:
    """The key worker's rules around :mod:`qim.core.e2ee.prekeys`, with its counters."""

    options: PreKeyOptions
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.published = Counter(
            "qim_prekey_publish_total",
            "PREKEY_PUBLISH by result (stored, or the refusal's detail)",
            ["result"],
            registry=self.registry,
        )
        self.handed = Counter(
            "qim_prekey_fetch_bundles_total",
            "bundles handed out by PREKEY_FETCH: one_time, or signed_prekey_fallback (7.14:"
            " the fallback is counted)",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("one_time", "signed_prekey_fallback"):
            self.handed.labels(kind=kind)  # exported at 0 before the first fetch
        self.exhausted = Counter(
            "qim_prekey_exhausted_total",
            "PREKEY_FETCH refused with PREKEY_EXHAUSTED (tenant forbids the fallback)",
            registry=self.registry,
        )
        self.low_water = Counter(
            "qim_prekey_low_water_notices_total",
            "low-water notices sent to bundle owners (e2ee_prekey_low_watermark)",
            registry=self.registry,
        )

    def _connection_shard(self, tenant_id: str, user_id: str) -> int:
        bucket = user_bucket(tenant_id, user_id, self.options.virtual_bucket_count)
        return connection_shard_id(bucket, self.options.connection_shard_count)

    @staticmethod
    def _error(request: PrekeyRequest, refusal: Refusal) -> PrekeyReply:
        error = Error(code=int(refusal.code), detail=refusal.detail, request_id=request.request_id)
        return _reply(request, error=error)

    def handle(self, request: PrekeyRequest, row_bytes: bytes | None) -> Handled:
        row = decode_user_bundles(row_bytes)
        if isinstance(request, PrekeyFetchRequest):
            return self._fetch(request, row)
        refusal = check_publish(request.message)
        if refusal is not None:
            self.published.labels(result=refusal.detail).inc()
            return Handled(None, (self._error(request, refusal),))
        devices = row.as_dict()
        stored = publish(devices.get(request.device_id), request.message)
        devices[request.device_id] = stored
        self.published.labels(result="stored").inc()
        status = PrekeyFetchDown(bundles=(own_status(request.device_id, stored),))
        return Handled(
            encode_user_bundles(UserBundles.of(devices)), (_reply(request, bundles=status),)
        )

    def _fetch(self, request: PrekeyFetchRequest, row: UserBundles) -> Handled:
        outcome = fetch(
            row,
            request.message,
            fallback_allowed=request.tenant_id not in self.options.no_fallback_tenants,
            low_watermark=self.options.low_watermark,
        )
        if outcome.refusal is not None:
            self.exhausted.inc()
            return Handled(None, (self._error(request, outcome.refusal),))
        replies = [_reply(request, bundles=PrekeyFetchDown(bundles=outcome.bundles))]
        for bundle in outcome.bundles:
            kind = "signed_prekey_fallback" if bundle.one_time_exhausted else "one_time"
            self.handed.labels(kind=kind).inc()
        owner = request.message.target_user_id
        after = outcome.after.as_dict()
        for device in outcome.low_water:
            self.low_water.inc()
            notice = PrekeyFetchDown(bundles=(own_status(device, after[device]),))
            replies.append(
                PrekeyReply(
                    tenant_id=request.tenant_id,
                    user_id=owner,
                    device_id=device,
                    connection_shard=self._connection_shard(request.tenant_id, owner),
                    bundles=notice,
                )
            )
        store = encode_user_bundles(outcome.after) if outcome.changed else None
        return Handled(store, tuple(replies))


def _reply(
    request: PrekeyRequest, *, bundles: PrekeyFetchDown | None = None, error: Error | None = None
) -> PrekeyReply:
    return PrekeyReply(
        tenant_id=request.tenant_id,
        user_id=request.user_id,
        device_id=request.device_id,
        session_epoch=request.session_epoch,
        connection_shard=request.connection_shard,
        request_id=request.request_id,
        bundles=bundles,
        error=error,
    )
