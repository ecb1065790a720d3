import json

import numpy as np
import pytest

from dspark.scheduling import StepCostModel
from dspark.sim.surface import (
    CostSurface,
    SurfaceCostModel,
    seed_tables_from_surface,
    vllm_capture_sizes,
)


def tiny_surface_json():
    target = [
        {"context_len": c, "num_reqs": r, "query_len": q, "ms": 1.0 + 0.001 * c * r + 0.5 * r * q}
        for c in (1000, 3000)
        for r in (1, 4)
        for q in (1, 2)
    ]
    draft = [{"context_len": c, "num_reqs": r, "ms": 0.1 * r} for c in (1000, 3000) for r in (1, 4)]
    return {"target": target, "draft": draft}


def test_grid_points_are_reproduced_and_interpolated_linearly(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(tiny_surface_json()))
    surface = CostSurface.load(path)
    assert surface.name == "mine"
    model = SurfaceCostModel(surface)
    assert isinstance(model, StepCostModel)
    # 4 requests, 8 tokens (q = 2), context 3000 each: 1 + 12 + 4 = 17 ms plus 0.4 draft.
    assert model.step_ms(4, 8, 4 * 3000) == pytest.approx(17.4)
    # Halfway in context (2000): 1 + 8 + 4 + 0.4.
    assert model.step_ms(4, 8, 4 * 2000) == pytest.approx(13.4)
    # Past the last query length the slope continues: q = 3 adds another 2 ms.
    assert model.step_ms(4, 12, 4 * 3000) == pytest.approx(19.4)
    # Between request counts, linearly: 2 requests lie a third of the way from 1 to 4, so
    # target 4.5 + (15 - 4.5) / 3 = 8.0 (q = 1, context 3000) and draft 0.2.
    assert model.step_ms(2, 2, 2 * 3000) == pytest.approx(8.2)
    assert SurfaceCostModel(surface, include_draft=False).step_ms(4, 8, 4 * 3000) == 17.0


def test_costs_never_decrease_with_tokens_on_the_h200_surface():
    model = SurfaceCostModel(CostSurface.load())
    for num_reqs in (1, 3, 100, 256, 400):
        for context in (500, 1024, 6000, 12000):
            costs = model.step_costs_ms(num_reqs, num_reqs, 7 * num_reqs, num_reqs * context)
            assert (np.diff(costs) >= 0).all()
            assert costs[0] > 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("draft"), "'draft'"),
        (lambda d: d["target"].pop(), "full grid"),
        (lambda d: d["target"][0].pop("ms"), "target rows need"),
        (lambda d: d["target"][0].update(ms=-1.0), "finite and >= 0"),
    ],
)
def test_bad_surface_files_are_clear_errors(tmp_path, mutate, message):
    data = tiny_surface_json()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        CostSurface.load(path)
    with pytest.raises(ValueError, match="cannot read"):
        CostSurface.load(tmp_path / "missing.json")


def test_seed_tables_price_tokens_as_the_seeds_dummy_runs_do():
    surface = CostSurface.load()
    tables = seed_tables_from_surface(surface, max_num_seqs=256, max_num_tokens=8192)
    # 128 tokens: a dummy run of 128 requests x 1 token at 8192 context, graph-captured.
    assert tables.verify_ms[128] == pytest.approx(
        surface.target_cost(128, np.array([128]), 8192)[0]
    )
    # 512 tokens: 256 requests x 2 tokens.
    assert tables.verify_ms[512] == pytest.approx(
        surface.target_cost(256, np.array([512]), 8192)[0]
    )
    assert tables.draft_ms[64] == pytest.approx(surface.draft_cost(64, 8192))
    # It ignores the context: a 1k-context batch costs what an 8k one does.
    assert (
        tables.step_costs_ms(256, 256, 0, 256 * 1024)[0]
        == tables.step_costs_ms(256, 256, 0, 256 * 8192)[0]
    )


def test_capture_sizes_follow_vllm_defaults():
    sizes = vllm_capture_sizes()
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 512
    assert 256 in sizes and 272 in sizes and 264 not in sizes
