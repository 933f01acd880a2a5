"""How ``engram up`` restarts an embedded server that died: the budget of tries, and
giving up loudly once it is spent. (The restart of a real server killed under a real
``engram up``: tests/engram/test_up.py.)"""

from __future__ import annotations

import pytest

from engram.supervisor import RestartBudget, ServerGaveUpError, ServerWatch


def test_the_pause_doubles_up_to_its_cap_and_the_budget_is_per_window() -> None:
    budget = RestartBudget(max_tries=4, window_s=60.0, first_pause_s=1.0, max_pause_s=3.0)
    assert [budget.next_pause_s(t) for t in (0.0, 1.0, 2.0, 3.0)] == [1.0, 2.0, 3.0, 3.0]
    assert budget.next_pause_s(4.0) is None  # four tries within the minute: spent
    assert budget.next_pause_s(60.5) == 3.0  # the first try has left the window


class _NeverStarts:
    """A server that died and fails every start (its port taken, say)."""

    pid = None
    tries = 0

    def running(self) -> bool:
        return False

    def restart(self) -> None:
        self.tries += 1
        raise OSError("address in use")


def test_a_server_that_never_starts_again_ends_in_an_error_after_its_tries() -> None:
    server = _NeverStarts()
    watch = ServerWatch("valkey", server, budget=RestartBudget(max_tries=3, first_pause_s=0.0))
    with pytest.raises(ServerGaveUpError, match="valkey keeps dying or will not start: 3 restarts"):
        for _ in range(10):
            watch.check()
    assert server.tries == 3
