"""Tensor-parallel pieces that need no second process: the vocabulary split of the LM
head, and the plan message's round trip."""

import numpy as np
import pytest
import torch

from dspark.engine.kv_cache import BlockTable
from dspark.engine.step_message import StepPlanMessage
from dspark.models.parallel import TensorShard, joined_logits, vocab_head, vocab_logits


@pytest.mark.parametrize(("vocab", "size"), [(8, 2), (7, 2), (10, 3), (5, 4)])
def test_every_ranks_part_of_the_vocabulary_joins_into_the_whole_logits(vocab, size):
    generator = torch.Generator().manual_seed(vocab * size)
    head = torch.randn(vocab, 6, generator=generator, dtype=torch.float64)
    hidden = torch.randn(3, 6, generator=generator, dtype=torch.float64)
    parts = []
    for rank in range(size):
        part = vocab_head(head, TensorShard(rank, size))
        assert part.data_ptr() == head[TensorShard(rank, size).span(vocab)[0]].data_ptr()
        parts.append(vocab_logits(hidden, part, vocab, size))
    assert len({p.shape for p in parts}) == 1  # one shape for the all-gather
    joined = joined_logits(parts, vocab)
    assert joined.dtype == torch.float32 and joined.shape == (3, vocab)
    torch.testing.assert_close(joined, (hidden @ head.T).float())


def test_a_plan_message_round_trips_with_its_logit_rows():
    tables = [BlockTable([3, 1], region=None, spilled=False), BlockTable([], 2, True)]
    message = StepPlanMessage(
        np.array([5, 6, 7, 8]),
        np.array([10, 0]),
        np.array([3, 1]),
        np.array([2, 0]),
        tables,
        np.array([0, 1, 2]),
    )
    back = StepPlanMessage.decode(message.encode())
    for name in ("tokens", "num_cached", "num_query", "num_admitted", "logit_rows"):
        assert getattr(back, name).tolist() == getattr(message, name).tolist()
    assert [(t.blocks, t.region, t.spilled) for t in back.tables] == [
        ([3, 1], None, False),
        ([], 2, True),
    ]
    empty = StepPlanMessage(*(np.array(v) for v in ([1], [0], [1], [0])), tables[:1], np.array([]))
    assert StepPlanMessage.decode(empty.encode()).logit_rows.tolist() == []
