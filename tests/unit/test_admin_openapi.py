"""The admin API's OpenAPI document: current, and naming every route the server registers."""

from __future__ import annotations

import json
from typing import get_args, get_type_hints

from qim.admin.groups import SETTABLE_ROLES
from qim.admin.http import make_group_admin_app
from qim.admin.models import SetRoleBody
from qim.admin.openapi import COMMITTED, document, render


class _NoAdmin:
    pass


def test_the_committed_document_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == render(), "run: python -m qim.admin.openapi"


def test_every_registered_route_is_in_the_document_and_nothing_else() -> None:
    app = make_group_admin_app(_NoAdmin(), "0123456789abcdef")  # type: ignore[arg-type]
    routes = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    paths = document()["paths"]
    documented = {(m, p) for p, ops in paths.items() for m in ops}
    assert routes == documented


def test_every_request_body_refuses_unknown_fields_and_every_ref_resolves() -> None:
    doc = document()
    schemas = doc["components"]["schemas"]
    text = json.dumps(doc)
    for name in schemas:
        if name.endswith("Body") and name != "AdminErrorBody":
            assert schemas[name]["additionalProperties"] is False, name
    for ref in {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}:
        assert ref in schemas, ref


def test_the_role_body_accepts_exactly_the_roles_the_admin_may_set() -> None:
    assert set(get_args(get_type_hints(SetRoleBody)["role"])) == set(SETTABLE_ROLES)
