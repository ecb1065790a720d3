"""The draft allocation on torch tensors, CPU or CUDA, with no host synchronisation.

Same decision as ``dspark.scheduling.allocate_drafts``: the ``budget`` slots of highest
survival win, ties go to the earlier position and then to the lower request index, and
each request's winners are a prefix of its drafts. The budget is a host integer (the
host chose it), so every shape here is known on the host and nothing is read back.
"""

from __future__ import annotations

import torch


def survival_by_position_torch(confidences: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """float64 ``[K, num_reqs]`` survival, unscheduled slots zeroed (running product
    taken left to right, as the NumPy version does, so both agree bit for bit)."""
    survival = confidences.t().to(torch.float64).contiguous()  # [K, num_reqs]
    positions = torch.arange(survival.shape[0], device=survival.device)[:, None]  # [K, 1]
    survival.mul_(positions < num_drafts[None, :])
    for k in range(1, survival.shape[0]):
        survival[k].mul_(survival[k - 1])
    return survival


def allocate_drafts_torch(
    confidences: torch.Tensor, num_drafts: torch.Tensor, budget: int
) -> torch.Tensor:
    """Admitted drafts per request, ``[num_reqs]`` int64 on the inputs' device.

    Args:
        confidences: ``[num_reqs, K]`` fresh confidences in [0, 1] (not checked here:
            checking would read values back to the host).
        num_drafts: ``[num_reqs]`` integer drafts scheduled per request, at most K.
        budget: slots to admit, ``0 <= budget <= num_drafts.sum()`` (the caller knows
            the sum on the host).
    """
    if confidences.dim() != 2 or num_drafts.shape != confidences.shape[:1]:
        raise ValueError(
            "confidences must be [num_reqs, K] and num_drafts [num_reqs], got "
            f"{tuple(confidences.shape)} and {tuple(num_drafts.shape)}"
        )
    if budget < 0:
        raise ValueError(f"budget must be non-negative, got {budget}")
    num_drafts = num_drafts.to(torch.int64)
    if budget == 0:
        return torch.zeros_like(num_drafts)
    survival = survival_by_position_torch(confidences, num_drafts)
    num_positions, num_reqs = survival.shape
    if budget >= survival.numel():
        return num_drafts.clone()
    flat = survival.view(-1)  # position-major: slot (k, r) at k * num_reqs + r
    threshold = torch.topk(flat, budget, sorted=False).values.min()
    above = flat > threshold
    missing = budget - above.sum()
    # Slots equal to the threshold win in flat order, i.e. by position, then request.
    ties = flat == threshold
    positions = torch.arange(num_positions, device=flat.device).repeat_interleave(num_reqs)
    ties &= positions < num_drafts.repeat(num_positions)  # a zero may be unscheduled
    wins = above | (ties & (torch.cumsum(ties, dim=0) <= missing))
    return wins.view(num_positions, num_reqs).sum(dim=0)
