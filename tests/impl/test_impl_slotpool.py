"""The device slot pool's claims (impl/storage.py): the free lists ``free_slots`` reads, in the
order ``take`` hands slots out, through take, release and unclaim."""

from __future__ import annotations

from kvstate.impl.storage import SlotPool


def test_free_lists_follow_claims() -> None:
    p = SlotPool(4)
    assert p.free_slots() == ([0, 1, 2, 3], [])
    home = p.claim_free(7)  # a new record's preferred slot, reserved, not taken
    assert home == 0 and p.free_slots() == ([1, 2, 3], [0])
    assert p.take(7, home) == 0 and p.free_slots() == ([1, 2, 3], [])
    p.release(0)  # still claimed by record 7: filed with the claimed slots
    assert p.free_slots() == ([1, 2, 3], [0]) and p.claim[0] == 7
    assert p.take(9, -1) == 1  # another record takes an unclaimed slot first
    p.unclaim(0, 7)  # record 7 moved or was forgotten: its slot is anyone's
    assert p.free_slots() == ([2, 3, 0], []) and p.claim[0] == 0
    p.unclaim(1, 7)  # not 7's claim: nothing changes
    assert p.claim[1] == 9 and p.free_slots() == ([2, 3, 0], [])
    assert p.free == 3


def test_claimed_slot_taken_only_when_no_unclaimed_is_left() -> None:
    p = SlotPool(2)
    assert p.take(5, -1) == 0 and p.take(6, -1) == 1
    p.release(0)
    p.release(1)  # both free, both claimed (by 5 and 6)
    assert p.free_slots() == ([], [0, 1])
    assert p.take(8, -1) == 0  # the least recently freed claimed slot: its claimant will move
    assert p.claim[0] == 8 and p.free_slots() == ([], [1])
    p.unclaim(1, 6)
    assert p.free_slots() == ([1], [])


def test_untake_restores_the_claim_take_replaced() -> None:
    """An allocation that fails after its slot (no SWA pages) gives the slot back as it was:
    claimed again by the record it was taken from, not by the record that failed."""
    p = SlotPool(2)
    assert p.take(5, -1) == 0 and p.take(6, -1) == 1
    p.release(0)
    assert p.take(8, -1) == 0 and p.displaced == 5  # taken from 5's claim
    p.untake(0, p.displaced)
    assert p.claim[0] == 5 and p.free_slots() == ([], [0]) and not p.busy[0]
    p.release(1)
    p.unclaim(1, 6)
    assert p.take(9, -1) == 1 and p.displaced == 0
    p.untake(1, 0)
    assert p.claim[1] == 0 and p.free_slots() == ([1], [0])
