from dspark.engine.kv_cache import PagedKVCache
from dspark.engine.request import Request
from dspark.engine.sampling import SamplingParams
from dspark.engine.scheduler import Scheduler
from dspark.models.config import ModelConfig
from tests.conftest import tiny_config


def make(num_blocks, budget=64):
    cache = PagedKVCache(ModelConfig.from_hf(tiny_config()), num_blocks, block_size=4)
    return Scheduler(cache, max_num_seqs=4, max_num_batched_tokens=budget)


def request(name, prompt_len, computed=0):
    r = Request(name, list(range(prompt_len)), SamplingParams(), 0.0)
    r.num_computed = computed
    return r


def test_decodes_run_before_an_older_requests_prompt_chunk():
    scheduler = make(num_blocks=64, budget=8)
    old = request("old", 100)  # admitted first, still prefilling
    new = request("new", 5, computed=4)  # admitted later, decoding
    for r in (old, new):
        scheduler.add(r)
    scheduler.waiting.clear()
    scheduler.running = [old, new]
    for r in (old, new):
        assert scheduler.cache.reserve(r.table, r.num_computed)
    chunks = scheduler.schedule(draft_room=2)
    assert [c.request.request_id for c in chunks] == ["new", "old"]
    assert chunks[0].num_tokens == 1 and chunks[0].draft_room == 2
    assert chunks[1].num_tokens == 8 - 3  # what the decode and its drafts left


def test_a_request_scheduled_this_step_is_never_preempted():
    # 3 blocks of 4 rows: the decode holds 2, the older prompt needs 2 more than is free.
    scheduler = make(num_blocks=3, budget=64)
    old = request("old", 12, computed=0)
    new = request("new", 6, computed=5)
    scheduler.running = [old, new]
    assert scheduler.cache.reserve(new.table, 5)
    chunks = scheduler.schedule(draft_room=0)
    # The decode went first; the prompt could only get room by preempting it, so the
    # prompt (the only unscheduled candidate) waits instead.
    assert [c.request.request_id for c in chunks] == ["new"]
    assert new in scheduler.running and new.num_computed == 5
    assert list(scheduler.waiting) == [old] and old.num_preemptions == 1
