"""Tool contracts: the catalogue, MCP annotations, approval rules, child keys."""

from datetime import timedelta
from decimal import Decimal

import pytest
from pydantic import BaseModel

from onceflow.tools import ApprovalThreshold, DedupeStrategy, EffectFlags, ToolContract
from onceflow.tools.worker import (
    CATALOGUE,
    Catalogue,
    UnknownTool,
    arguments_digest,
    derive_child_key,
    derive_task_workflow_id,
    key_digest,
)


class Amount(BaseModel):
    amount: int


def contract(**overrides: object) -> ToolContract:
    fields: dict[str, object] = {
        "name": "t",
        "description": "d",
        "input_model": Amount,
        "effects": EffectFlags(),
        "dedupe": DedupeStrategy.NONE,
        "start_to_close_timeout": timedelta(seconds=5),
    }
    fields.update(overrides)
    return ToolContract(**fields)  # type: ignore[arg-type]


def test_the_reference_tools_are_catalogued_with_their_strategies() -> None:
    strategies = {tool.name: tool.dedupe for tool in CATALOGUE}
    assert strategies["issue_coupon"] is DedupeStrategy.NATURAL_KEY
    assert strategies["create_order"] is DedupeStrategy.LOCAL_TRANSACTION


def test_mcp_annotations_are_derived_from_the_effect_flags() -> None:
    flags = EffectFlags(read_only=False, destructive=True, idempotent=False, open_world=True)
    assert contract(effects=flags).mcp_annotations() == {
        "title": "t",
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
    assert CATALOGUE.get("issue_coupon").mcp_annotations()["openWorldHint"] is False


def test_a_name_is_registered_once_and_unknown_names_are_reported() -> None:
    catalogue = Catalogue((contract(),))
    with pytest.raises(ValueError, match="already registered"):
        catalogue.register(contract())
    with pytest.raises(UnknownTool, match="unknown tool 'nope'"):
        catalogue.get("nope")


def test_approval_thresholds_compare_the_named_argument() -> None:
    gated = contract(
        requires_approval=True,
        approval_threshold=ApprovalThreshold(argument="amount", above=Decimal(100)),
    )
    assert not gated.needs_approval(Amount(amount=100))
    assert gated.needs_approval(Amount(amount=101))
    assert contract(requires_approval=True).needs_approval(Amount(amount=0))
    assert not contract().needs_approval(Amount(amount=10**9))


def test_a_provider_key_is_safe_to_repeat_only_inside_its_retention_minus_margin() -> None:
    keyed = contract(
        dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
        provider_key_retention=timedelta(hours=24),
        retention_margin=timedelta(hours=1),
    )
    assert keyed.safe_repeat_window(timedelta(hours=3)) == timedelta(hours=20)
    assert keyed.safe_repeat_window(timedelta(hours=23)) == timedelta(0)
    assert keyed.safe_repeat_window(timedelta(hours=30)) == timedelta(0)
    assert contract(dedupe=DedupeStrategy.NATURAL_KEY).safe_repeat_window(timedelta(days=9)) is None
    assert contract().safe_repeat_window(timedelta(0)) == timedelta(0)


def test_child_keys_are_stable_and_distinct_per_child_operation() -> None:
    identity = {
        "tenant": "acme",
        "workflow_id": "task-1",
        "step_id": "pay",
        "provider_account": "acct",
    }
    charge = derive_child_key(child_op="charge", **identity)
    assert charge == derive_child_key(child_op="charge", **identity)
    assert charge != derive_child_key(child_op="refund", **identity)
    assert charge != derive_child_key(child_op="charge", **{**identity, "step_id": "pay2"})
    # Length-prefixing keeps shifted boundaries apart.
    assert derive_child_key(
        tenant="ab", workflow_id="c", step_id="s", child_op="o", provider_account="a"
    ) != derive_child_key(
        tenant="a", workflow_id="bc", step_id="s", child_op="o", provider_account="a"
    )
    assert len(charge) <= 255 and "acme" not in charge


def test_task_ids_and_digests_never_contain_the_raw_key() -> None:
    raw = "client-secret-key-123"
    assert raw not in derive_task_workflow_id(
        tenant="acme", scope="issue_coupon", idempotency_key=raw
    )
    assert raw not in key_digest(raw)
    assert arguments_digest("t", {"a": 1, "b": 2}) == arguments_digest("t", {"b": 2, "a": 1})
    assert arguments_digest("t", {"a": 1}) != arguments_digest("u", {"a": 1})
