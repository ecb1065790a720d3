import gc
import weakref

from dspark.engine.heap import CollectorPauses, freeze_heap, frozen_heap


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


def test_a_heap_frozen_before_the_block_stays_frozen_after_it():
    try:
        freeze_heap()
        node = _Node()  # made after the first freeze, frozen by the block's
        alive = weakref.ref(node)
        with frozen_heap():
            del node
        gc.collect()
        assert gc.get_freeze_count() > 0 and alive() is not None
    finally:
        gc.unfreeze()
    gc.collect()
    assert alive() is None
