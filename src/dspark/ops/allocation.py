"""The draft allocation on torch tensors, CPU or CUDA, with no host synchronisation.

Same decision as ``dspark.scheduling.allocate_drafts``: the ``budget`` slots of highest
survival win, ties go to the earlier position and then to the lower request index, and
each request's winners are a prefix of its drafts. The budget is a host integer (the
host chose it), so every shape here is known on the host and nothing is read back.
"""

from __future__ import annotations

import torch


def survival_by_position_torch(
    confidences: torch.Tensor, is_scheduled: torch.Tensor
) -> torch.Tensor:
    """float64 ``[K, num_reqs]`` survival, unscheduled slots zeroed. The running product
    along K runs per column, left to right, as the NumPy version's does, so both agree
    bit for bit."""
    survival = confidences.t().to(torch.float64) * is_scheduled  # [K, num_reqs]
    return torch.cumprod(survival, dim=0)


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
    num_reqs, num_positions = confidences.shape
    num_drafts = num_drafts.to(torch.int64)
    if budget == 0:
        return torch.zeros_like(num_drafts)
    if budget >= num_reqs * num_positions:
        return num_drafts.clone()
    positions = torch.arange(num_positions, device=confidences.device)
    is_scheduled = positions[:, None] < num_drafts[None, :]  # [K, num_reqs]
    flat = survival_by_position_torch(confidences, is_scheduled).view(-1)  # (k, r) at k*n + r
    # The budget-th largest survival: the (num_slots - budget + 1)-th smallest.
    threshold = torch.kthvalue(flat, flat.shape[0] - budget + 1).values
    above = flat > threshold
    # Slots equal to the threshold win in flat order, i.e. by position, then request; a
    # zero may be an unscheduled slot, which never wins.
    ties = (flat == threshold) & is_scheduled.view(-1)
    wins = above | (ties & (torch.cumsum(ties, dim=0) <= budget - above.sum()))
    return wins.view(num_positions, num_reqs).sum(dim=0)
