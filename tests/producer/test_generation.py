"""The watcher's write generation (`producer/generation.py`): a loss is noticed also when a write failed
first (the master killed under it, an OOM refusal) and the memory was reloaded from the Redis that lost
the writes, which is what a failover does."""

from __future__ import annotations

from producer.generation import Generation


def _tracked() -> tuple[Generation, list[tuple[int, int]]]:
    gen = Generation()
    losses: list[tuple[int, int]] = []
    gen.on_lost = lambda expected, found: losses.append((expected, found))
    return gen, losses


def test_a_value_below_the_last_written_is_a_loss() -> None:
    gen, losses = _tracked()
    for v in (1, 2, 3):
        gen.wrote(v)
    gen.seen(3)
    assert losses == []
    gen.seen(2)  # rolled back: the write of 3 lost
    assert losses == [(3, 2)]


def test_after_a_failed_write_a_value_below_the_acknowledged_one_is_still_a_loss() -> None:
    gen, losses = _tracked()
    for v in (1, 2, 3, 4):
        gen.wrote(v)
    gen.unknown()  # the master killed under a write; the memory is reloaded from the promoted replica
    gen.seen(2)  # the replica had 2: the writes of 3 and 4 lost
    assert losses == [(4, 2)] and gen.lost == 1
    gen.wrote(3)  # numbered on from what Redis holds now: no second loss
    gen.seen(3)
    assert losses == [(4, 2)]


def test_after_a_failed_write_a_write_not_above_the_acknowledged_one_is_a_loss() -> None:
    gen, losses = _tracked()
    for v in (1, 2, 3, 4):
        gen.wrote(v)
    gen.unknown()
    gen.wrote(3)  # the next write, on the promoted replica that had 2
    assert losses == [(4, 2)]
    gen.unknown()
    gen.wrote(5)  # a failed write that was applied (4), then this one: nothing lost
    assert losses == [(4, 2)]


def test_a_failed_write_alone_is_no_loss_and_an_absent_value_forgets_everything() -> None:
    gen, losses = _tracked()
    gen.wrote(1)
    gen.unknown()
    gen.seen(1)
    gen.seen(2)  # the failed write was applied after all
    gen.wrote(3)
    gen.seen(None)  # the mirror gone (the `synced` check ends the watcher)
    gen.wrote(1)
    assert losses == []
