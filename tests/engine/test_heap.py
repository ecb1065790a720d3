import gc
import weakref

from dspark.engine import heap
from dspark.engine.heap import CollectorPauses, freeze_heap, frozen_heap, keep_heap_frozen


class _Node:
    def __init__(self) -> None:
        self.other = self  # a reference cycle: only the cyclic collector frees it


def test_a_cycle_dropped_while_frozen_is_kept_until_the_heap_is_unfrozen():
    node = _Node()
    alive = weakref.ref(node)
    with frozen_heap() as count:
        assert count > 0 and gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert alive() is not None  # frozen: no collection walks it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None


def test_a_cycle_made_after_the_freeze_is_still_collected():
    try:
        freeze_heap()
        node = _Node()
        alive = weakref.ref(node)
        del node
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()


def test_pauses_count_collections_by_generation_only_while_watching():
    pauses = CollectorPauses()
    gc.collect()  # not watched
    with pauses.watching():
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    gc.collect()
    assert pauses.counts == [1, 0, 2]
    assert all(s >= 0.0 for s in pauses.seconds) and pauses.seconds[2] > 0.0
    assert pauses._callback not in gc.callbacks


def test_a_heap_someone_else_froze_is_thawed_after_the_block_so_a_dropped_cycle_is_freed():
    # The GPU machine's Python starts with a few hundred objects frozen; a block that
    # left such a heap frozen kept every benchmark engine frozen in it, for good.
    try:
        freeze_heap()
        node = _Node()  # made after the first freeze, frozen by the block's
        alive = weakref.ref(node)
        with frozen_heap():
            del node
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()


def test_a_heap_kept_frozen_stays_frozen_after_the_block(monkeypatch):
    monkeypatch.setattr(heap, "_KEPT_FROZEN", False)
    try:
        assert keep_heap_frozen() > 0
        node = _Node()
        alive = weakref.ref(node)
        with frozen_heap():
            del node
        gc.collect()
        assert gc.get_freeze_count() > 0 and alive() is not None
    finally:
        gc.unfreeze()
        monkeypatch.setattr(heap, "_KEPT_FROZEN", False)
    gc.collect()
    assert alive() is None
