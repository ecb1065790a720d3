import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.scheduling import allocate_drafts

torch = pytest.importorskip("torch")
from dspark.ops import allocate_drafts_torch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def case(seed, num_reqs, k, grid):
    rng = np.random.default_rng(seed)
    conf = rng.random((num_reqs, k)).astype(np.float32)
    if grid:
        conf = np.round(conf * grid) / grid  # exact ties, exact zeros
    drafts = rng.integers(0, k + 1, num_reqs)
    budget = int(rng.integers(0, drafts.sum() + 1))
    return conf, drafts, budget


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 70), st.integers(1, 9), st.sampled_from([0, 2, 8]))
def test_torch_allocation_equals_numpy(device, seed, num_reqs, k, grid):
    conf, drafts, budget = case(seed, num_reqs, k, grid)
    expected = allocate_drafts(conf, drafts, budget)
    got = allocate_drafts_torch(
        torch.from_numpy(conf).to(device), torch.from_numpy(drafts).to(device), budget
    )
    assert got.device.type == device
    assert got.cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_allocation_by_hand(device):
    conf = torch.tensor([[0.9, 0.9, 0.9], [0.5, 1.0, 1.0], [0.95, 0.1, 1.0]], device=device)
    drafts = torch.tensor([3, 3, 3], device=device)
    assert allocate_drafts_torch(conf, drafts, 4).tolist() == [3, 0, 1]
    ones = torch.ones(3, 3, device=device)
    assert allocate_drafts_torch(ones, drafts, 4).tolist() == [2, 1, 1]
    assert allocate_drafts_torch(ones, drafts, 0).tolist() == [0, 0, 0]


def test_torch_allocation_rejects_bad_shapes():
    with pytest.raises(ValueError, match="num_reqs, K"):
        allocate_drafts_torch(torch.ones(2, 3), torch.ones(3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="budget must be non-negative"):
        allocate_drafts_torch(torch.ones(2, 3), torch.ones(2, dtype=torch.int64), -1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocation_is_graph_capturable_without_host_sync():
    conf, drafts, budget = case(7, 256, 7, 0)
    conf_gpu = torch.from_numpy(conf).cuda()
    drafts_gpu = torch.from_numpy(drafts).cuda()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        out = allocate_drafts_torch(conf_gpu, drafts_gpu, budget)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.cpu().tolist() == allocate_drafts(conf, drafts, budget).tolist()
