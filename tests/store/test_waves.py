"""Cutting a batch into waves so that each model phase sees its scope's earlier
operations: pure."""

from __future__ import annotations

from engram.store.write.waves import held_back, next_wave


def test_a_scope_stops_at_its_next_model_phase_other_scopes_go_on() -> None:
    # (scope, has a model phase)
    items = [("a", False), ("a", True), ("b", True), ("a", False), ("b", False), ("c", False)]
    taken, later = next_wave(items, lambda i: i[0], lambda i: i[1])
    # a: its first op, then the model op waits with everything after it;
    # b: its model op leads the wave (its phase sees b as committed so far).
    assert taken == [0, 2, 4, 5] and later == [1, 3]
    rest = [items[i] for i in later]
    assert next_wave(rest, lambda i: i[0], lambda i: i[1]) == ([0, 1], [])


def test_a_batch_without_model_phases_is_one_wave() -> None:
    items = [("a", False)] * 3
    assert next_wave(items, lambda i: i[0], lambda i: i[1]) == ([0, 1, 2], [])


def test_held_back_holds_from_a_scope_s_first_phase_on_and_all_of_a_holding_scope() -> None:
    items = [("a", False), ("a", True), ("a", False), ("b", False), ("c", False), ("b", True)]
    now, held = held_back(items, lambda i: i[0], lambda i: i[1], lambda scope: scope == "c")
    assert (now, held) == ([0, 3], [1, 2, 4, 5])
