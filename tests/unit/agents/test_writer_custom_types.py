"""``QIM_CUSTOM_TYPES`` reaches the ConversationWriter's config, and a bad one stops the start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qim.agents.writer.options import WriterOptions
from qim.params import Settings

CARD = {
    "custom_type": "order.card",
    "schema_version": 2,
    "delivery_class": "persistent",
    "counts_unread": False,
    "affects_session_order": True,
    "timeline_visible": True,
    "anchor_mode": "own_seq",
    "preview_template": "[Order]",
    "max_payload_bytes": 4096,
    "minimum_client_version": "2.1",
}


def load(env: dict[str, str]) -> WriterOptions:
    return WriterOptions.load(
        Settings.load(env={}), env, bootstrap="127.0.0.1:1", datadir=Path("/nonexistent")
    )


def test_declarations_from_the_environment_are_the_writers() -> None:
    options = load({"QIM_CUSTOM_TYPES": json.dumps({"shop": [CARD]})})
    found = options.config.custom_types.lookup("shop", "order.card")
    assert found is not None and (found.schema_version, found.counts_unread) == (2, False)
    assert options.config.custom_types.lookup("other", "order.card") is None
    assert load({}).config.custom_types.lookup("shop", "order.card") is None


def test_a_tenants_lower_payload_cap_bounds_its_declarations() -> None:
    overrides = json.dumps({"shop": {"max_custom_payload_bytes": 1024}})
    with pytest.raises(ValueError, match="max_custom_payload_bytes 1024"):
        load({"QIM_CUSTOM_TYPES": json.dumps({"shop": [CARD]}), "QIM_TENANT_OVERRIDES": overrides})


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        json.dumps([CARD]),  # not keyed by tenant
        json.dumps({"shop": [{**CARD, "delivery_class": "sometimes"}]}),
        json.dumps({"shop": [{k: v for k, v in CARD.items() if k != "anchor_mode"}]}),
    ],
)
def test_a_bad_declaration_stops_the_writer_at_start(raw: str) -> None:
    with pytest.raises(ValueError, match="QIM_CUSTOM_TYPES"):
        load({"QIM_CUSTOM_TYPES": raw})
