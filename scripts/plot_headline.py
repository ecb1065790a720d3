"""The README's headline plot: adaptive verification against the best fixed K (and against
no speculation where a run has it) at every concurrency, one marker per bench run, from
the ``bench.json`` files that ``dspark bench`` wrote; and the 8B shape's throughput curves
on the current code, its levels' runs merged into one ``dspark bench`` plot.

    .venv/bin/python scripts/plot_headline.py [OUT.png]

Each run's best fixed K is the fastest fixed-K setting of that run at that level (the
fixed Ks a run compares are the ones earlier sweeps found best there); a marker is the
ratio of medians over the run's repeats, its bar the range of the per-repeat (paired)
ratios. Plain adaptive only (variants of an in-run A/B are left out). Prints the same
numbers as a table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from dspark.figures import save_figure

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "bench"

# (panel title, [(run label, bench.json's folder relative to RESULTS[, the row of
# adaptive at the shipped defaults when it is not plain "adaptive≤7"])]), newest last.
PANELS = [
    (
        "H200, Llama-3-8B shape, acceptance REPLAYED (published chat rates)",
        [
            ("s23 b6e3c79", "h200/session23/b8_c16_x3"),
            ("s23 b6e3c79", "h200/session23/b8_c64_x3"),
            ("s24 4455bf8", "h200/session24/b8_c16_x5"),
            ("s25 c1f747f", "h200/session25/b8_c4_c1_x3"),
            ("s25 c1f747f", "h200/session25/b8_c64_x3"),
            ("s25 c1f747f", "h200/session25/b8_c256_x2"),
            ("s25 c1f747f", "h200/session25/b8_c256_noshare_x2"),
            ("s28 9789a63", "h200/session28/recut_c256/run1"),
            ("s28 9789a63", "h200/session28/recut_c256/run2"),
            ("s28 9789a63", "h200/session28/recut_c256/run3"),
            ("s28 9789a63", "h200/session28/recut_c256/run4"),
            ("s28 9789a63", "h200/session28/b8_c4_x2"),
            ("s28 9789a63", "h200/session28/b8_c16_x3"),
            ("s28 9789a63", "h200/session28/b8_c64_x2"),
            # Session 33 (cea5631's code): every level but 64, whose JSON was lost (its
            # table is in b8_c64_x2/log.txt); 1 cut short after four of five repeats.
            ("s33 cea5631", "h200/session33/b8_c1_x4"),
            ("s33 cea5631", "h200/session33/b8_c4_x2"),
            ("s33 cea5631", "h200/session33/b8_c16_x3"),
            ("s33 cea5631", "h200/session33/b8_c256_x2"),
            # Session 34 (a8c9cc1 and the bench's covered_tokens): 16 twice, with the
            # overhead slope memory (sm) and capture-every-shape (g0) variants beside.
            ("s34 a8c9cc1", "h200/session34/b8_c16v"),
            ("s34 a8c9cc1", "h200/session34/b8_c16x6"),
            ("s34 a8c9cc1", "h200/session34/b8_c16m5"),
            # Session 35: fill_padding on by default, unfilled as the variant "nf" beside;
            # 40afd90 filled without charging the ledger for the own shape, 1ca6591 with.
            ("s35 40afd90", "h200/session35/b8_c16_nocharge"),
            ("s35 40afd90", "h200/session35/b8_c64_nocharge"),
            ("s35 1ca6591", "h200/session35/b8_c4"),
            ("s35 1ca6591", "h200/session35/b8_c16"),
            ("s35 1ca6591", "h200/session35/b8_c16b"),
            ("s35 1ca6591", "h200/session35/b8_c64"),
            ("s35 1ca6591", "h200/session35/b8_c256"),
            # Session 36 (78810c0): overhead_slope_noise, the default since, as the "sn"
            # variant; b8_c1la's plain adaptive (then the default) beside the look-ahead off.
            ("s36 78810c0", "h200/session36/b8_c1la"),
            ("s36 +sn", "h200/session36/b8_c1sn", "adaptive≤7 sn"),
            ("s36 +sn", "h200/session36/b8_c4sn", "adaptive≤7 sn"),
            ("s36 +sn", "h200/session36/b8_c16sn", "adaptive≤7 sn"),
            ("s36 +sn", "h200/session36/b8_c16sn2", "adaptive≤7 sn"),
            ("s36 +sn", "h200/session36/b8_c64sn", "adaptive≤7 sn"),
            ("s36 +sn", "h200/session36/b8_c256sn", "adaptive≤7 sn"),
            ("s37 ea36ce2", "h200/session37/b8_c1"),
            ("s37 ea36ce2", "h200/session37/b8_c4"),
            ("s37 ea36ce2", "h200/session37/b8_c16"),
            # Session 38 (3be362f): the drafter's greedy heads replayed as CUDA graphs.
            ("s38 3be362f", "h200/session38/b8_s38_c16"),
            ("s38 3be362f", "h200/session38/b8_s38_c1"),
            ("s38 3be362f", "h200/session38/b8_s38_m2_c16"),
            ("s38 3be362f", "h200/session38/b8_s38_m2_c4"),
            # Session 39 (31da6fe): every level on one machine, the current code.
            ("s39 31da6fe", "h200/session39/b8_s39_c1"),
            ("s39 31da6fe", "h200/session39/b8_s39_c4"),
            ("s39 31da6fe", "h200/session39/b8_s39_c16"),
            ("s39 31da6fe", "h200/session39/b8_s39_c64"),
            ("s39 31da6fe", "h200/session39/b8_s39_c256"),
            ("s41 afb7dcf", "h200/session41/b8_s41_c16"),
            ("s41 afb7dcf", "h200/session41/b8_s41_c256"),
            ("s40 7c59e15", "h200/session40/b8_s40_dc_c16"),
            ("s40 7c59e15", "h200/session40/b8_s40_dc_c1"),
            ("s42 +st", "h200/session42/b8_s42_c1", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/b8_s42_c4", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/b8_s42_c16", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/b8_s42_c64", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/b8_s42_c256g", "adaptive≤7 st"),
            # Session 43 (e364dee's code): settle the default, so plain "adaptive≤7".
            ("s43 e364dee", "h200/session43/b8_s43_c1"),
            ("s43 e364dee", "h200/session43/b8_s43_c4"),
            ("s43 e364dee", "h200/session43/b8_s43_c16"),
            ("s43 e364dee", "h200/session43/b8_s43_c64"),
            ("s43 e364dee", "h200/session43/b8_s43_c256"),
            # Session 46 (ec528a5's code): the drafter's block cut to each depth ("cut"),
            # the default since, beside the full block, the default on CUDA before.
            ("s46 cut", "h200/session46/b8_s46_c1", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/b8_s46_c4", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/b8_s46_c16", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/b8_s46_c64", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/b8_s46_c256", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/b8_s46_c256_r3", "adaptive≤7 cut"),
            # e208b89 (held-back upkeep priced; the cut the default): plain "adaptive≤7".
            ("s46 e208b89", "h200/session46/b8_s46_c16_upkeep"),
            ("s46 e208b89", "h200/session46/b8_s46_c1_upkeep"),
            # Session 47 (6a287a5's code, the final engine): plain "adaptive≤7".
            ("s47 6a287a5", "h200/session47/b8_s47_c1"),
            ("s47 6a287a5", "h200/session47/b8_s47_c4"),
            ("s47 6a287a5", "h200/session47/b8_s47_c16"),
            ("s47 6a287a5", "h200/session47/b8_s47_c64"),
            ("s47 6a287a5", "h200/session47/b8_s47_c256"),
        ],
    ),
    (
        "H200, SmolLM2-135M + shipped drafter",
        [
            ("s23 b6e3c79", "h200/session23/c256_1_x3"),
            ("s23 b6e3c79", "h200/session23/c4_16_x5_freezeyes"),
            ("s23 b6e3c79", "h200/session23/c64_16_x5_freezeyes"),
            ("s23 b6e3c79", "h200/session23/c64_x3_freezeyes"),
            ("s24 e34ef01", "h200/session24/cal_c16_64_x5"),
            ("s24 04de6db", "h200/session24/margin_c4_16_64_x5"),
            ("s28 9789a63", "h200/session28/smollm2_c16_64"),
            # The engine's process held to two cores (taskset -c 2,3): no steadier.
            ("s28 taskset", "h200/session28/smollm2_c16_64_pinned"),
            # Session 30: every run with the host probe around it (run_modes.txt beside).
            ("s30 b476565", "h200/session30/mid_c16_c64_x8"),
            ("s30 b476565", "h200/session30/c1_x5"),
            ("s30 b476565", "h200/session30/c256_x4"),
            ("s30 df60cc9", "h200/session30/ab_c1_nogate_x6"),
            ("s30 df60cc9", "h200/session30/ab_c256_pad0_nola_x3"),
            # Session 31: run with the overhead slope memory on by default; its "nomem"
            # variant is the default now (no consistent gain from the memory).
            ("s31 f4b82b0", "h200/session31/ab256", "adaptive≤7 nomem"),
            ("s31 f4b82b0", "h200/session31/ab64", "adaptive≤7 nomem"),
            ("s31 f4b82b0", "h200/session31/ab16", "adaptive≤7 nomem"),
            ("s31 f4b82b0", "h200/session31/ab1", "adaptive≤7 nomem"),
            # Session 32 (4617c0b): the gate's 128-step window at one request beside 16
            # ("old"); levels 16 and 64; adaptive with K = 4 at 16 (--k 4).
            ("s32 4617c0b", "h200/session32/gate1"),
            ("s32 4617c0b", "h200/session32/gate4"),
            ("s32 4617c0b", "h200/session32/now16"),
            ("s32 4617c0b", "h200/session32/now64"),
            ("s32 4617c0b k4", "h200/session32/k4c16", "adaptive≤4"),
            # The gate's windows as running sums (76a874d): 128 steps against 16 at one.
            ("s32 76a874d", "h200/session32/gate1b"),
            # Session 34 (a8c9cc1): every level, a depth margin of 0.05 (m5) beside.
            ("s34 a8c9cc1", "h200/session34/smollm2_c1"),
            ("s34 a8c9cc1", "h200/session34/smollm2_c16"),
            ("s34 a8c9cc1", "h200/session34/smollm2_c16b"),
            ("s34 a8c9cc1", "h200/session34/smollm2_c64"),
            ("s34 a8c9cc1", "h200/session34/smollm2_c256"),
            ("s35 40afd90", "h200/session35/smollm2_c256_nocharge"),
            ("s35 1ca6591", "h200/session35/smollm2_c1"),
            ("s35 1ca6591", "h200/session35/smollm2_c256"),
            ("s36 +sn", "h200/session36/smollm2_s1sn", "adaptive≤7 sn"),
            ("s36 +sn", "h200/session36/smollm2_s16sn", "adaptive≤7 sn"),
            # The look-ahead off beside plain adaptive (overhead_slope_noise then off).
            ("s36 78810c0", "h200/session36/smollm2_s1la"),
            ("s36 78810c0", "h200/session36/smollm2_s16la"),
            ("s37 ea36ce2", "h200/session37/smollm2_s1"),
            ("s37 ea36ce2", "h200/session37/smollm2_s16"),
            ("s37 ea36ce2", "h200/session37/smollm2_s16b"),
            ("s37 ea36ce2", "h200/session37/smollm2_s1b"),
            ("s37 ea36ce2", "h200/session37/smollm2_s1v"),
            # Session 38: s38_c1 and s38_c16 ran 3be362f's head graphs (its eager heads
            # differ: README there); the margins runs 3be362f.
            ("s38 3be362f", "h200/session38/s38_c1"),
            ("s38 3be362f", "h200/session38/s38_c16"),
            ("s38 3be362f", "h200/session38/s38_m_c1"),
            ("s38 3be362f", "h200/session38/s38_m_c16"),
            # Session 39 (31da6fe), greedy: 24 requests at 1 (twice), 4 to 256.
            ("s39 31da6fe", "h200/session39/s39_w_c1"),
            ("s39 31da6fe", "h200/session39/s39_w1b"),
            ("s39 31da6fe", "h200/session39/s39_c4"),
            ("s39 31da6fe", "h200/session39/s39_c16"),
            ("s39 31da6fe", "h200/session39/s39_c64"),
            ("s39 31da6fe", "h200/session39/s39_c256"),
            ("s40 7c59e15", "h200/session40/s40_dc_c16"),
            ("s40 7c59e15", "h200/session40/s40_dc_c64"),
            ("s40 7c59e15", "h200/session40/s40_c64"),
            ("s40 7c59e15", "h200/session40/s40_c256"),
            ("s40 sliced", "h200/session40/s40_sl"),
            ("s41 sliced", "h200/session41/s41_sl"),
            ("s41 cheap cuts", "h200/session41/s41_cc"),
            ("s41 c64", "h200/session41/s41_c64"),
            ("s41 split", "h200/session41/s41_split"),
            ("s41 b9f6f35", "h200/session41/s41_fin"),
            ("s41 b9f6f35", "h200/session41/s41_c256"),
            # Session 42: EngineConfig.settle (the default on CUDA since) as the "st"
            # variant beside plain adaptive; s42_low_8eee435 before the guard on a draft
            # more a request's price (55204b3), the rest after.
            ("s42 +st", "h200/session42/s42_low_8eee435", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/s42_low", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/s42_256g", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/s42_256r", "adaptive≤7 st"),
            ("s42 +st", "h200/session42/s42_c1", "adaptive≤7 st"),
            # Session 43 (e364dee's code, after session 42's review): settle the default,
            # so plain "adaptive≤7"; "pl" (settle off) beside it.
            ("s43 e364dee", "h200/session43/s43_lo"),
            ("s43 e364dee", "h200/session43/s43_1"),
            ("s43 e364dee", "h200/session43/s43_16"),
            ("s43 e364dee", "h200/session43/s43_64"),
            ("s43 e364dee", "h200/session43/s43_256"),
            # Session 46 (ec528a5's code), "cut" as for the 8B shape; s46_1 cut short by its
            # time limit after three of four windows (bench.partial.json).
            ("s46 cut", "h200/session46/s46_lo", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/s46_1", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/s46_16", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/s46_64", "adaptive≤7 cut"),
            ("s46 cut", "h200/session46/s46_256", "adaptive≤7 cut"),
            # Session 47 (6a287a5's code, the final engine): plain "adaptive≤7", no
            # speculation at every level in the first runs; 64 and 256 again beside the old
            # pricing (upkeep_in_price=false, a variant, left out here).
            ("s47 6a287a5", "h200/session47/s47_lo"),
            ("s47 6a287a5", "h200/session47/s47_16"),
            ("s47 6a287a5", "h200/session47/s47_64"),
            ("s47 6a287a5", "h200/session47/s47_64b"),
            ("s47 6a287a5", "h200/session47/s47_64c"),
            ("s47 6a287a5", "h200/session47/s47_64d"),
            ("s47 6a287a5", "h200/session47/s47_256"),
            ("s47 6a287a5", "h200/session47/s47_256c"),
        ],
    ),
    (
        "this 2-core CPU, SmolLM2-135M + shipped drafter",
        [
            ("s22 acafded", "cpu_session22_c16_x3"),
            ("s23 6a10c78", "cpu_session23_default_c1_c4_x3"),
            ("s23 d2104b9", "cpu_session23_mainjob_d2104b9"),
            ("s23 2912f06", "cpu_session23_mainjob_2912f06"),
            ("s24 e34ef01", "cpu_session24_cal"),
            ("s24 04de6db", "cpu_session24_margin"),
            # This run had normalise_speed on by default; its "raw" variant is the default now.
            ("s24 304addc", "cpu_session24_speed", "adaptive≤7 raw"),
            ("s24 304addc", "cpu_session24_mainjob_304addc"),
            ("s24 3d7e829", "cpu_session24_mainjob_3d7e829"),
            ("s25 2256fc4", "cpu_session25_mainjob_2256fc4"),
            ("s25 2ed12df", "cpu_session25_c1_c4_x7"),
            ("s26 af53c21", "cpu_session26_mainjob_af53c21"),
            ("s26 037a99c", "cpu_session26_mainjob_037a99c"),
            ("s27 42c4998", "cpu_session27_mainjob_42c4998"),
            ("s27 2cf95a1", "cpu_session27_mainjob_2cf95a1"),
            ("s28 0a54856", "cpu_session28_mainjob_0a54856"),
            # Default adaptive beside a variant (overhead_fit=depth, context_rows), K = 1, 3.
            ("s29 3347316", "cpu_session29_dfit_c1_c4_x5"),
            ("s29 413c6b4", "cpu_session29_rows_c1_c4_x5"),
            ("s29 9eb2565", "cpu_session29_mainjob_9eb2565"),
            # Default adaptive beside calibrate_survival=true, K = 1, 3, at 1 only.
            ("s30 df60cc9", "cpu_session30_cal_c1_x8"),
            ("s30 8d5bde4", "cpu_session30_mainjob_8d5bde4"),
            # Session 31: the gate's veto three errors wide at one request (the default at
            # ac4278a, replaced by a longer window at 8f7bf8c) against one ("old"), K = 1.
            ("s31 ac4278a", "cpu_session31_gate_c1_x6"),
            ("s31 ac4278a", "cpu_session31_gate_c1_x10"),
            ("s31 ea5f188", "cpu_session31_mainjob_ea5f188"),
            # The gate's window of 128 steps at one request (the default since 8f7bf8c)
            # against 16 ("old"), K = 1 beside.
            ("s31 8f7bf8c", "cpu_session31_window_c1_x6"),
            ("s31 5ae17e9", "cpu_session31_mainjob_5ae17e9"),
            ("s32 28e8906", "cpu_session32_mainjob_28e8906"),
            ("s33 71d8e70", "cpu_session33_mainjob_71d8e70"),
            # CPU products padded to a faster row count (d2b6de7) against the tree before
            # (2a75966), alternating processes; then the main job on d2b6de7.
            ("s33 2a75966", "cpu_session33_pad_ab/1_old"),
            ("s33 d2b6de7", "cpu_session33_pad_ab/1_new"),
            ("s33 2a75966", "cpu_session33_pad_ab/2_old"),
            ("s33 d2b6de7", "cpu_session33_pad_ab/2_new"),
            ("s33 2a75966", "cpu_session33_pad_ab/3_old"),
            ("s33 d2b6de7", "cpu_session33_pad_ab/3_new"),
            ("s33 d2b6de7", "cpu_session33_mainjob_d2b6de7"),
            # Session 34 (a8c9cc1 and draft_margin, off): 1 and 4, K = 3 and no spec
            # beside, draft_margin=0.1 as a variant. (Its runs at 4 without a fixed K,
            # cpu_session34_c4*, cpu_session34_dm4, are against no spec alone.)
            ("s34 552e1df", "cpu_session34_dm1"),
            ("s34 eb132c9", "cpu_session34_mainjob_eb132c9"),
            ("s35 7c38399", "cpu_session35_mainjob_7c38399"),
            ("s36 +sn", "cpu_sn_session36", "adaptive≤7 sn"),
            ("s36 0d3a245", "cpu_session36_mainjob_0d3a245"),
            # Default adaptive beside profile_fit=isotonic, K = 1, 3.
            ("s36 17eb461", "cpu_iso_session36"),
            ("s37 bf70150", "cpu_session37_mainjob_bf70150"),
            ("s37 76a6296", "cpu_session37_mainjob_76a6296"),
            # Session 38: two main jobs back to back on 3be362f, the VM slow at 8 rows.
            ("s38 3be362f", "cpu_session38_mainjob_3be362f"),
            ("s38 3be362f", "cpu_session38_mainjob_3be362fb"),
            ("s38 ebc2880", "cpu_session38_mainjob_ebc2880"),
            # Session 39: the main job's settings, four repeats, with depth_ceiling beside.
            ("s39 ceiling", "cpu_session39_dc"),
            ("s39 22c037d", "cpu_session39_mainjob_22c037d"),
            ("s40 sliced", "cpu_session40_sliced"),
            ("s40 b85d222", "cpu_session40_mainjob_b85d222"),
            ("s40 c9cc1c6", "cpu_session40_mainjob_c9cc1c6"),
            ("s41 5087da5", "cpu_session41_mainjob_5087da5"),
            ("s41 2c71044", "cpu_session41_mainjob_2c71044"),
            ("s42 4f091e6", "cpu_session42_mainjob_4f091e6"),
            ("s42 7a2aa9a", "cpu_session42_mainjob_7a2aa9a"),
            ("s42 fd33b23", "cpu_session42_mainjob_fd33b23"),
            ("s43 8a74373", "cpu_session43_mainjob_8a74373"),
            ("s43 89d5d9e", "cpu_session43_mainjob_89d5d9e"),
            ("s43 c16", "cpu_session43_c16/run1"),
            ("s43 c16", "cpu_session43_c16/run2"),
            ("s44 ad6a479", "cpu_session44_mainjob_ad6a479"),
            ("s44 1b09e15", "cpu_session44_mainjob_1b09e15"),
            ("s44 c16", "cpu_session44_c16_ad6a479"),
            ("s44 c16", "cpu_session44_c16_ad6a479_r6"),
            ("s44 c16", "cpu_session44_c16_ad6a479_w12"),
            ("s44 c16", "cpu_session44_c16_ad6a479_steplog"),
            ("s44 cut", "cpu_session44_draft_block/c1c4"),
            ("s44 cut c16", "cpu_session44_draft_block/c16"),
            ("s44 4c9508a", "cpu_session44_mainjob_4c9508a"),
            ("s44 4c9508a c16", "cpu_session44_c16_4c9508a_w12"),
            ("s44 e435283", "cpu_session44_mainjob_e435283"),
            ("s44 3312b19", "cpu_session44_mainjob_3312b19"),
            ("s45 322c81a", "cpu_session45_mainjob_322c81a"),
            ("s45 1a284d8", "cpu_session45_mainjob_1a284d8"),
            ("s45 322c81a c16", "cpu_session45_c16_322c81a"),
            ("s45 322c81a c16", "cpu_session45_c16_settle_322c81a"),
            ("s45 ff47535 c16", "cpu_session45_c16_margin_ff47535"),
            ("s45 rows c16", "cpu_session45_c16_rows_only"),
            ("s45 6ad3b66 c16", "cpu_session45_c16_6ad3b66"),
            ("s45 6ad3b66", "cpu_session45_mainjob_6ad3b66"),
            ("s45 ec528a5", "cpu_session45_mainjob_ec528a5"),
            ("s45 ec528a5 c16", "cpu_session45_c16_ec528a5"),
            ("s45 ec528a5 c16", "cpu_session45_c16_ec528a5_run2"),
            ("s46 355dc50", "cpu_session46_mainjob_355dc50"),
            ("s46 e208b89 c16", "cpu_session46_c16_e208b89"),
            ("s46 e208b89 c16", "cpu_session46_c16_e208b89_run2"),
            ("s46 150d893", "cpu_session46_mainjob_150d893"),
            ("s46 150d893 c16", "cpu_session46_c16_150d893"),
            ("s46 150d893 c16", "cpu_session46_c16_150d893_w8"),
        ],
    ),
]


def ratios(path: Path, adaptive_label: str | None = None) -> list[dict]:
    """Per concurrency of one bench.json: adaptive (plain, or the row ``adaptive_label``)
    over the best fixed K and over no speculation."""
    rows = bench_rows(path)
    out = []
    for conc in sorted({r["concurrency"] for r in rows}):
        level = [r for r in rows if r["concurrency"] == conc]
        adaptive = [
            r
            for r in level
            if (r["label"] == adaptive_label)
            or (
                adaptive_label is None
                and r["label"].startswith("adaptive")
                and " " not in r["label"]
            )
        ]
        fixed = [r for r in level if r["label"].startswith("K=")]
        none = [r for r in level if r["label"] == "no spec"]
        if not adaptive or not fixed:
            continue
        a, best = adaptive[0], max(fixed, key=lambda r: r["tok_s"])
        entry = {
            "concurrency": conc,
            "best": best["label"],
            "vs_best": a["tok_s"] / best["tok_s"],
            "paired_best": np.divide(a["tok_s_runs"], best["tok_s_runs"]),
            "repeats": len(a["tok_s_runs"]),
        }
        if none:
            entry["vs_none"] = a["tok_s"] / none[0]["tok_s"]
            entry["paired_none"] = np.divide(a["tok_s_runs"], none[0]["tok_s_runs"])
        out.append(entry)
    return out


def bench_rows(path: Path) -> list[dict]:
    """A run's rows: ``bench.json``'s, or where the run was cut short (only
    ``bench.partial.json``, one entry per finished run) each setting's runs gathered as
    ``dspark bench`` gathers them (tok/s and per-user tok/s the medians over repeats)."""
    if (path / "bench.json").exists():
        return json.loads((path / "bench.json").read_text())["rows"]
    runs: dict[tuple[int, str], list[dict]] = {}
    for run in json.loads((path / "bench.partial.json").read_text()):
        runs.setdefault((run["concurrency"], run["label"]), []).append(run)
    return [
        {
            "concurrency": conc,
            "label": label,
            "tok_s": float(np.median([r["tok_s"] for r in done])),
            "tok_s_runs": [r["tok_s"] for r in done],
            "per_user_tok_s": float(np.median([r["per_user_tok_s"] for r in done])),
        }
        for (conc, label), done in runs.items()
    ]


# The 8B shape's levels on the current code (session 39: 31da6fe, every level on one
# machine; session 36's sweep, 78810c0, is in docs/results/bench/h200/session36/):
# (folder, the row of adaptive at the defaults), drawn as "adaptive≤7" with the run's
# other adaptive rows left out.
SWEEP_8B = [  # session 47, 6a287a5, the final engine (session 46's: h200/session46/b8_s46_c*)
    ("h200/session47/b8_s47_c1", "adaptive≤7"),
    ("h200/session47/b8_s47_c4", "adaptive≤7"),
    ("h200/session47/b8_s47_c16", "adaptive≤7"),
    ("h200/session47/b8_s47_c64", "adaptive≤7"),
    ("h200/session47/b8_s47_c256", "adaptive≤7"),
]

SWEEP_SMOLLM2 = [  # session 47, 6a287a5: every level's first run, each with no speculation
    ("h200/session47/s47_lo", "adaptive≤7"),
    ("h200/session47/s47_16", "adaptive≤7"),
    ("h200/session47/s47_64", "adaptive≤7"),
    ("h200/session47/s47_256", "adaptive≤7"),
]


def plot_merged_sweep(folders: list[tuple[str, str]], out: Path, title: str) -> None:
    """One ``dspark bench`` plot (throughput vs load, vs per-user speed) of several runs'
    rows; each level comes from one run, with the fixed Ks that run compared, and its
    adaptive row at the defaults."""
    from dspark.bench.sweep import plot

    rows = []
    for folder, default in folders:
        for r in bench_rows(RESULTS / folder):
            if r["label"] == default:
                rows.append({**r, "label": "adaptive≤7"})
            elif not r["label"].startswith("adaptive"):
                rows.append(r)
    # A setting not run at a level gets a gap there, not a line drawn across it.
    levels = sorted({r["concurrency"] for r in rows})
    for label in {r["label"] for r in rows}:
        run_at = {r["concurrency"] for r in rows if r["label"] == label}
        rows += [
            {"label": label, "concurrency": c, "tok_s": np.nan, "per_user_tok_s": np.nan}
            for c in levels
            if c not in run_at
        ]
    plot(rows, out, title)


def main() -> None:
    plot_merged_sweep(
        SWEEP_8B,
        RESULTS / "h200" / "session47" / "b8_levels.png",
        "H200, Llama-3-8B shape, acceptance REPLAYED; fixed Ks as run at each level",
    )
    plot_merged_sweep(
        SWEEP_SMOLLM2,
        RESULTS / "h200" / "session47" / "smollm2_levels.png",
        "H200, SmolLM2-135M + shipped drafter; fixed Ks as run at each level",
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "results" / "headline.png"
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 6.0), sharey=True)
    print(
        f"{'panel':10s} {'run':12s} {'conc':>4s} {'best':>5s} {'/best':>6s} "
        f"{'paired (range)':>22s} {'/none':>6s} repeats"
    )
    for ax, (title, runs) in zip(axes, PANELS, strict=True):
        # One colour and one legend entry a session: a panel holds up to ~50 runs.
        labels = list(dict.fromkeys(run[0].split()[0] for run in runs))
        colours = dict(
            zip(labels, plt.cm.viridis(np.linspace(0.0, 0.85, len(labels))), strict=True)
        )
        seen = set()
        for i, (run_label, rel, *row) in enumerate(runs):
            label = run_label.split()[0]
            for e in ratios(RESULTS / rel, *row):
                x = e["concurrency"] * 2.0 ** (0.07 * (i - len(runs) / 2))  # runs side by side
                paired = e["paired_best"]
                lo, hi = paired.min(), paired.max()
                ax.errorbar(
                    x,
                    e["vs_best"],
                    yerr=[[max(0.0, e["vs_best"] - lo)], [max(0.0, hi - e["vs_best"])]],
                    fmt="o",
                    color=colours[label],
                    capsize=2,
                    label=None if label in seen else label,
                )
                seen.add(label)
                if "vs_none" in e:
                    ax.plot(x, e["vs_none"], marker="x", color=colours[label], ls="none")
                none = f"{e['vs_none']:.3f}" if "vs_none" in e else ""
                print(
                    f"{title[:10]:10s} {run_label:12s} {e['concurrency']:4d} {e['best']:>5s} "
                    f"{e['vs_best']:6.3f} {np.median(paired):7.3f} ({lo:.3f}-{hi:.3f}) "
                    f"{none:>6s} {e['repeats']}"
                )
        ax.axhline(1.0, color="black", lw=1)
        ax.axhline(0.98, color="grey", lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 4, 16, 64, 256], ["1", "4", "16", "64", "256"])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=6)
    axes[0].set_ylabel(
        "adaptive tok/s ÷ best fixed K's (o, bars: paired range)\n÷ no speculation's (x, where run)"
    )
    fig.suptitle(
        "Adaptive verification against the best fixed K of the same run (dashed: 2% below)",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
