"""Tensor parallelism on the CPU (gloo, 2 ranks, fp32): the same tokens as one process,
the same plan on every rank, sampling still exact, and failures that surface in bounded
time with no process left behind."""

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from safetensors.torch import save_file

from dspark.engine.config import EngineConfig
from dspark.engine.distributed import TensorParallelError
from dspark.engine.engine import LLMEngine
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model
from dspark.models.parallel import TensorShard
from tests.conftest import ByteTokenizer, engine_config, make_tiny_model
from tests.engine.test_engine import (
    GREEDY,
    CheapCost,
    RandomCost,
    assert_first_two_follow,
    concentrated_model,
    exact_first_two,
    repetitive_prompts,
)

TP = 2
# Uneven on purpose: 3 key/value heads and 129 MLP columns over 2 ranks are 2 + 1 and 65 + 64.
UNEVEN = {"num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 129}


def rank0(loaded):
    """Rank 0's shard of a model saved at ``loaded.path``."""
    return load_model(loaded.path, tokenizer=loaded.tokenizer, shard=TensorShard(0, TP))


def generate(loaded, prompts, params=GREEDY, **config):
    cost = config.pop("cost_model", None)
    drafter = config.pop("drafter_model", None)
    if drafter is not None:
        from dspark.engine.drafter import DSparkDrafter

        drafter = DSparkDrafter(drafter, 8192, 16)
    if cost is not None:
        config.setdefault("throughput_gate", False)
    with LLMEngine(loaded, engine_config(**config), drafter=drafter, cost_model=cost) as engine:
        requests = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        digests = engine.plan_digests()
    return [r.output_ids for r in requests], engine.stats, digests


def child_pids() -> list[int]:
    """Live (not zombie) child processes of this process."""
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                state, parent = handle.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if parent == me and state != "Z":
            found.append(int(entry))
    return found


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_greedy_with_two_ranks_equals_one_process_and_every_rank_ran_every_plan(tmp_path):
    """No speculation, fixed K and adaptive (random budgets), their engines side by side
    over one loaded shard as ``dspark bench`` keeps them: each completes its partial sums
    with its own workers, and closing them gives back the thread count."""
    target = make_tiny_model(tmp_path / "t", num_hidden_layers=3, **UNEVEN)
    prompts = repetitive_prompts(5, seed=2)
    specs = ("none", "fixed", "adaptive")

    def engine(loaded, spec: str, **fields) -> LLMEngine:
        cost = RandomCost(4) if spec == "adaptive" else None  # the same budgets each time
        fields |= dict(spec=spec, num_drafts=3, max_num_seqs=4, throughput_gate=False)
        return LLMEngine(loaded, engine_config(**fields), cost_model=cost)

    def run(engines: list[LLMEngine]) -> list[list[list[int]]]:
        requests = [[e.add_request(p, GREEDY) for p in prompts] for e in engines]
        while any(e.has_unfinished() for e in engines):
            for e in engines:
                if e.has_unfinished():
                    e.step()
        return [[r.output_ids for r in rs] for rs in requests]

    alone = [engine(target, spec) for spec in specs]
    expected = run(alone)
    assert all(e.plan_digests() == {} for e in alone)  # one process sends no plans
    threads = torch.get_num_threads()
    shard = rank0(target)
    engines = [engine(shard, spec, tensor_parallel_size=TP) for spec in specs]
    got = run(engines)
    digests = [e.plan_digests() for e in engines]
    for e in engines:
        e.close()
    assert got == expected
    assert torch.get_num_threads() == threads
    for spec, e, plans in zip(specs, engines, digests, strict=True):
        if spec != "none":
            assert e.stats.num_verified > e.stats.num_decode_rounds  # drafts were verified
        assert sorted(plans) == [0, 1]
        assert len(plans[0]) == e.stats.num_steps  # one plan per forward
        assert plans[1] == plans[0]
        assert len(set(plans[0])) == len(plans[0])  # every step's plan differs


@pytest.mark.parametrize(
    "spec",
    # Adaptive drafts, verifies and decodes plainly; the others repeat that on SmolLM2.
    [*(pytest.param(s, marks=pytest.mark.slow) for s in ("none", "fixed")), "adaptive"],
)
def test_greedy_on_smollm2_with_two_ranks_equals_one_process(smollm2, spec):
    from dspark.engine.llm import LLM

    prompts = [
        "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    ]
    ids = [smollm2.tokenizer.encode(p) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    config = dict(spec=spec, num_drafts=4, drafter="dspark", throughput_gate=False)
    config |= dict(max_num_seqs=8, kv_cache_tokens=4096)
    expected, _, _ = generate(smollm2, ids, params, cost_model=RandomCost(9), **config)
    config = engine_config(**config)
    with LLM(None, config=config, tensor_parallel_size=TP, cost_model=RandomCost(9)) as llm:
        outputs = llm.generate(ids, params)
        stats = llm.engine.stats
    assert [o.token_ids for o in outputs] == expected
    assert (stats.num_verified > stats.num_decode_rounds) == (spec != "none")


def saved(loaded, path):
    """``loaded``'s current weights written as a checkpoint at ``path``."""
    state = {
        f"model.{k}" if not k.startswith("lm_head") else k: v.contiguous().clone()
        for k, v in loaded.model.state_dict().items()
        if not k.startswith("rotary")
    }
    save_file(state, str(path / "model.safetensors"))
    return loaded


def test_adaptive_sampling_with_two_ranks_follows_the_target(tmp_path):
    """Sampling and acceptance run on rank 0 alone, from its generators: at temperature
    1 the first two tokens still follow the target's exact distribution."""
    from dspark.engine.drafter import DSparkDrafter
    from tests.models.test_drafter import random_drafter

    live = 6
    target = saved(concentrated_model(tmp_path, live), tmp_path / "c")
    exact1, exact2 = exact_first_two(target, [3, 1, 4, 1, 5], live)
    shard = rank0(target)
    drafter = random_drafter(shard, block_size=4)
    config = engine_config(
        spec="adaptive",
        num_drafts=3,
        max_num_seqs=64,
        kv_cache_tokens=8192,
        throughput_gate=False,
        tensor_parallel_size=TP,
    )
    with LLMEngine(
        shard, config, drafter=DSparkDrafter(drafter, 8192, 16), cost_model=CheapCost(3)
    ) as engine:
        requests = [
            engine.add_request(
                [3, 1, 4, 1, 5],
                SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=i),
            )
            for i in range(1500)
        ]
        while engine.has_unfinished():
            engine.step()
    assert engine.stats.num_accepted > engine.stats.num_decode_rounds + 200
    assert_first_two_follow(requests, (exact1, exact2), live)


@pytest.mark.parametrize(
    ("sig", "reason"), [("SIGKILL", "killed by signal SIGKILL"), ("SIGSTOP", "stalled")]
)
def test_a_dead_or_stalled_worker_is_named_within_the_bound_and_nothing_is_left(
    tmp_path, sig, reason
):
    timeout_s = 2.0
    before = set(child_pids())
    target = make_tiny_model(tmp_path / "t")
    config = EngineConfig(tensor_parallel_size=TP, tp_timeout_s=timeout_s)
    threads = torch.get_num_threads()
    with LLMEngine(rank0(target), config) as engine:
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True))
        for _ in range(3):
            engine.step()
        [worker] = set(child_pids()) - before
        os.kill(worker, getattr(signal, sig))
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match=f"rank 1 \\(pid {worker}\\) .*{reason}"):
            while engine.has_unfinished():
                engine.step()
        # The bound: the collective's timeout, a second's grace for an exit status, slack.
        assert time.monotonic() - start < timeout_s + 2.5
        assert set(child_pids()) == before
        with pytest.raises(TensorParallelError):  # and it stays failed
            engine.step()
    assert torch.get_num_threads() == threads  # closing gives the process its threads back


WORKER_OF_A_KILLED_ENGINE = """
import sys
from dspark.engine.config import EngineConfig
from dspark.engine.engine import LLMEngine
from dspark.models.loader import load_model
from dspark.models.parallel import TensorShard
from tests.conftest import ByteTokenizer
loaded = load_model(sys.argv[1], tokenizer=ByteTokenizer(), shard=TensorShard(0, 2))
engine = LLMEngine(loaded, EngineConfig(tensor_parallel_size=2))
print("ready", flush=True)
sys.stdin.read()
"""


def progress_files() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "dspark-tp-progress-*")))


def test_workers_exit_when_the_engine_process_is_killed(tmp_path):
    target = make_tiny_model(tmp_path / "t")
    files = progress_files()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen(
        [sys.executable, "-c", WORKER_OF_A_KILLED_ENGINE, str(target.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert parent.stdout.readline().strip() == "ready"
        children = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(parent.pid)], capture_output=True, text=True
        ).stdout.split()
        [worker] = [int(pid) for pid in children]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 3.0
        while is_running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_running(worker)
        assert progress_files() == files
    finally:
        parent.kill()


def test_a_whole_model_or_an_impossible_split_is_refused_before_any_worker_starts(tiny):
    before = set(child_pids())
    with pytest.raises(ValueError, match="rank 0's shard"):
        LLMEngine(tiny, EngineConfig(tensor_parallel_size=TP))
    with pytest.raises(ValueError, match="exceeds the model's 2 key/value heads"):
        load_model(tiny.path, tokenizer=ByteTokenizer(), shard=TensorShard(0, 3))
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(tensor_parallel_size=TP, cuda_graphs="on")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=0)
    assert set(child_pids()) == before


def test_shards_cover_every_head_and_column_once():
    from dspark.models.config import ModelConfig
    from dspark.models.parallel import local_config

    config = ModelConfig(49152, 576, 1536, 30, 9, 3, 64)  # SmolLM2-135M's shape
    parts = [local_config(config, TensorShard(r, 2)) for r in range(2)]
    assert [p.num_kv_heads for p in parts] == [2, 1]
    assert [p.num_heads for p in parts] == [6, 3]
    assert sum(p.intermediate_size for p in parts) == 1536
    spans = [
        TensorShard(r, 2).slice_of("model.layers.0.self_attn.o_proj.weight", config)
        for r in range(2)
    ]
    assert spans == [(1, 0, 384), (1, 384, 576)]
    assert TensorShard(1, 2).slice_of("model.embed_tokens.weight", config) is None
    with torch.no_grad():  # the column-parallel pieces put back together are the whole
        weight = torch.randn(config.num_kv_heads * 64, 8)
        pieces = [
            weight[a:b]
            for _, a, b in (
                TensorShard(r, 2).slice_of("layers.1.self_attn.k_proj.weight", config)
                for r in range(2)
            )
        ]
        assert torch.equal(torch.cat(pieces), weight)
