"""Group commit: runners' batches that meet are committed together; fences stay apart."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from store import Fence, FencedError, HashingEmbedder, Operation, Store, WriteResult
from worker.committer import Committer


class GatedEmbedder(HashingEmbedder):
    """Holds its first call until released, so other requests queue up behind it."""

    def __init__(self) -> None:
        super().__init__(32)
        self.release = threading.Event()
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> Any:
        self.calls += 1
        if self.calls == 1:
            assert self.release.wait(10)
        return super().embed(texts)


def _ops(user: str, n: int) -> list[Operation]:
    return [
        Operation.build("remember", {"user_id": user}, {"text": f"{user} {i}"}) for i in range(n)
    ]


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _wait_for(predicate: Any) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_batches_that_meet_share_one_commit_and_a_stale_fence_fails_alone(
    fresh_store: Store,
) -> None:
    fresh_store.execute([], fence=Fence("partition:2", 10))
    embedder = GatedEmbedder()
    committer = Committer(fresh_store, embedder)

    first, first_out = _in_thread(
        lambda: committer.execute(_ops("a", 1), Fence("partition:0", 1), {})
    )
    _wait_for(lambda: embedder.calls == 1)
    second, second_out = _in_thread(
        lambda: committer.execute(_ops("b", 3), Fence("partition:1", 1), {})
    )
    third, third_out = _in_thread(
        lambda: committer.execute(_ops("c", 2), Fence("partition:2", 5), {})
    )
    _wait_for(lambda: len(committer._waiting) == 2)
    embedder.release.set()
    for t in (first, second, third):
        t.join(10)

    assert [type(r) for r in first_out["value"]] == [WriteResult]
    assert [type(r) for r in second_out["value"]] == [WriteResult] * 3
    assert isinstance(third_out["error"], FencedError)
    assert third_out["error"].fences == ("partition:2",)
    # The first commit ran alone; the two that queued behind it met in one call
    # (tried once with the stale fence, then once without it).
    assert embedder.calls == 3
    assert fresh_store.scope_revision({"user_id": "b"}) == 3
    assert fresh_store.scope_revision({"user_id": "c"}) == 0


def test_a_database_failure_reaches_every_runner_of_the_group(fresh_store: Store) -> None:
    class BrokenOnce(HashingEmbedder):
        broken = True

        def embed(self, texts: Sequence[str]) -> Any:
            if self.broken:
                self.broken = False
                raise RuntimeError("embedder down")
            return super().embed(texts)

    committer = Committer(fresh_store, BrokenOnce(32))
    with pytest.raises(RuntimeError, match="embedder down"):
        committer.execute(_ops("a", 1), Fence("partition:0", 1), {})
    assert fresh_store.scope_revision({"user_id": "a"}) == 0
    # The committer is not left stuck in the lead: the next batch commits.
    done = committer.execute(_ops("a", 1), Fence("partition:0", 1), {})
    assert isinstance(done[0], WriteResult)
