"""Clear history and delete clear the unread (12.9), a manual-unread mark included (7.5)."""

from __future__ import annotations

import pytest

from qim.core.session_list import (
    ClearHistory,
    DeleteLocal,
    MarkRead,
    MarkUnread,
    UserConversationState,
    apply_change,
)

BASE = UserConversationState(conversation_id="c")


@pytest.mark.parametrize("change", [ClearHistory, DeleteLocal])
def test_a_clear_or_delete_covering_the_mark_removes_it(
    change: type[ClearHistory] | type[DeleteLocal],
) -> None:
    read = apply_change(BASE, MarkRead(10), activity_id=1)
    marked = apply_change(read, MarkUnread(10), activity_id=2)
    assert marked.manual_unread_conversation_seq == 10
    cleared = apply_change(marked, change(10), activity_id=3)
    assert cleared.manual_unread_conversation_seq is None
    assert cleared.visible_lower == 10


@pytest.mark.parametrize("change", [ClearHistory, DeleteLocal])
def test_a_mark_above_the_clear_stays_and_a_repeat_without_mark_is_a_no_op(
    change: type[ClearHistory] | type[DeleteLocal],
) -> None:
    first = apply_change(BASE, change(10), activity_id=1)
    assert apply_change(first, change(10), activity_id=2) is first
    marked = apply_change(first, MarkUnread(12), activity_id=3)
    again = apply_change(marked, change(11), activity_id=4)
    assert again.manual_unread_conversation_seq == 12  # newer than what was cleared
    # an older clear that covers a mark only drops the mark, never moves the bound back
    late = apply_change(apply_change(first, MarkUnread(5), activity_id=5), change(7), activity_id=6)
    assert late.manual_unread_conversation_seq is None
    assert late.visible_lower == 10
