"""Which mechanism drafted each adaptive step, and what the cost model priced: ``dspark
bench`` run in-process with hooks on the verifier's ``drafting_pays`` (the rates it
priced by depth), the throughput gate's ``should_draft``/``should_probe`` (why it answered
as it did: unmeasured bucket, upper bound, exploration, probe, overrule), the cost model's
learning and the engine's steps. One JSON line per adaptive step to
``OUTDIR.decisions.jsonl``; ``scripts/cpu_gate_trace_summary.py`` sums the losses by
mechanism. A diagnostic: it wraps private methods and reads the gate's private ``_leader``,
so it follows the code of session 43 (c5f0fa2483eaf531).

    PYTHONPATH=src .venv/bin/python scripts/cpu_gate_trace.py OUTDIR [more bench args]

(concurrency 4, K = 1 beside adaptive, every step logged; session 43 ran it with
``--repeats 8``: ``docs/results/bench/cpu_session43_gate_trace/``.)
"""

import json
import sys

import numpy as np

import dspark.bench.sweep as sweep
import dspark.scheduling.verifier as vmod
from dspark.cli import build_parser
from dspark.engine.engine import LLMEngine
from dspark.scheduling.cost import ObservedDraftCost
from dspark.scheduling.gate import DECLINED, DRAFTED, UNDRAFTED, ThroughputGate

OUT = sys.argv[1]
PHASE = ["warmup"]
MEASURED_WINDOW_S = [4.0]  # --window-s, set from the arguments below
CUR = {}  # the adaptive engine's current step record
LOG = open(f"{OUT}.decisions.jsonl", "w")


def f(x):
    if isinstance(x, np.ndarray):
        return np.round(x.astype(float), 4).tolist()
    if isinstance(x, (np.floating, float)):
        return round(float(x), 4)
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


# --- phase (which sliced window) ---------------------------------------------------
orig_windows = sweep.sliced_windows


def sliced_windows(loops, window_s, slice_s, freeze_gc=True, rotation=0):
    # The bench primes its loops with a window of PRIME_SHARE of --window-s first.
    PHASE[0] = "prime" if window_s < MEASURED_WINDOW_S[0] else f"window{rotation}"
    return orig_windows(loops, window_s, slice_s, freeze_gc, rotation)


sweep.sliced_windows = sliced_windows

# --- depth_rates / _plan_costs: what drafting_pays priced ------------------------------
orig_depth_rates = vmod.depth_rates


def depth_rates(survival, verify_ms, num_sampling, draft_ms):
    rates = orig_depth_rates(survival, verify_ms, num_sampling, draft_ms)
    if CUR.get("in_pays"):
        CUR["pays"] = dict(
            survival=f(survival),
            verify_ms=f(verify_ms),
            draft_ms=f(draft_ms),
            rates=f(rates),
            num_sampling=int(num_sampling),
        )
    return rates


vmod.depth_rates = depth_rates

orig_pays = vmod.AdaptiveVerifier.drafting_pays


def drafting_pays(self, slots, num_drafts, num_non_draft, num_sampling, context_tokens=0):
    CUR["in_pays"] = True
    CUR["predictiveness"] = f(self.predictiveness)
    CUR["population"] = f(self._population())
    try:
        depth = orig_pays(self, slots, num_drafts, num_non_draft, num_sampling, context_tokens)
    finally:
        CUR["in_pays"] = False
    CUR["pays_depth"] = int(depth)
    CUR["probe_depth_after_pays"] = int(self.probe_depth)
    CUR["slots"] = f(np.asarray(slots))
    return depth


vmod.AdaptiveVerifier.drafting_pays = drafting_pays


# --- the gate ---------------------------------------------------------------------------
def classify_draft(gate, num_reqs, mixed):
    """Replicates should_draft's logic without mutating: why it will answer as it will."""
    state = gate._get(num_reqs, mixed)
    since = state.since_explored + 1
    judged = gate._judged(state, num_reqs, mixed)
    info = dict(since=since, counts=[len(state.samples[a]) for a in (DRAFTED, UNDRAFTED, DECLINED)])
    if judged is None:
        for arm in (DRAFTED, UNDRAFTED):
            if len(state.samples[arm]) < gate.min_steps:
                info["reason"] = "unmeasured"
                return info
    info["judged_self"] = judged is state
    conf = gate._confidence(state)
    bound = [judged.upper_bound(arm, conf) for arm in (DRAFTED, UNDRAFTED)]
    info["ucb"] = [f(b) for b in bound]
    info["rates"] = [f(judged.rate_and_error(a)[0]) for a in (DRAFTED, UNDRAFTED)]
    info["errs"] = [f(judged.rate_and_error(a)[1]) for a in (DRAFTED, UNDRAFTED)]
    best, every = gate._leader(state, judged)  # the gate's own rule, not a copy
    info["every"] = every
    if since >= every:
        info["reason"] = "explore"
    else:
        info["reason"] = "ucb"
    info["best"] = "drafted" if best == DRAFTED else "undrafted"
    return info


orig_should_draft = ThroughputGate.should_draft


def should_draft(self, num_reqs, mixed=False):
    info = classify_draft(self, num_reqs, mixed)
    ans = orig_should_draft(self, num_reqs, mixed)
    info["answer"] = bool(ans)
    CUR["gate_draft"] = info
    return ans


ThroughputGate.should_draft = should_draft

orig_should_probe = ThroughputGate.should_probe


def should_probe(self, num_reqs, mixed=False):
    state = self._get(num_reqs, mixed)
    info = dict(
        declined=state.declined,
        probes_in_a_row=state.probes_in_a_row,
        overruled=state.overruled,
        counts=[len(state.samples[a]) for a in (DRAFTED, UNDRAFTED, DECLINED)],
    )
    judged = None
    if not mixed:
        own = state.samples
        if min(len(own[DECLINED]), len(own[UNDRAFTED])) >= self.min_steps:
            judged = state
        else:
            judged = self._judged(state, num_reqs, mixed)
    lead_ok = False
    if judged is not None:
        arm = DECLINED if len(judged.samples[DECLINED]) >= self.min_steps else DRAFTED
        lead = judged.lower_bound(arm, self.confidence)
        ub = judged.upper_bound(UNDRAFTED, self.confidence)
        info.update(
            arm="declined" if arm == DECLINED else "drafted", lead=f(lead), ub_undrafted=f(ub)
        )
        lead_ok = lead > ub
    ans = orig_should_probe(self, num_reqs, mixed)
    info["answer"] = bool(ans)
    info["reason"] = (
        ("overrule" if lead_ok else "probe")
        if ans
        else ("overrule-explore-skip" if lead_ok else "wait")
    )
    CUR["gate_probe"] = info
    return ans


ThroughputGate.should_probe = should_probe

# --- cost-model learning: measured drafter time and step misses --------------------------
orig_record = ObservedDraftCost.record


def record(self, num_reqs, drafting_ms, depth=None):
    CUR["drafter_record"] = dict(
        n=num_reqs, ms=f(drafting_ms), depth=depth, profiled=f(self._profiled(num_reqs, depth))
    )
    return orig_record(self, num_reqs, drafting_ms, depth)


ObservedDraftCost.record = record

orig_record_step = ObservedDraftCost.record_step


def record_step(self, num_reqs, num_tokens, num_drafts, depth, wall_ms, *rest, **named):
    out = orig_record_step(self, num_reqs, num_tokens, num_drafts, depth, wall_ms, *rest, **named)
    key = (int(num_reqs).bit_length(), depth == 0)
    missed = self._missed[key][-1][1]
    CUR["recorded_step"] = dict(
        n=num_reqs,
        tokens=num_tokens,
        drafts=num_drafts,
        depth=depth,
        wall=f(wall_ms),
        missed=f(missed),
    )
    return out


ObservedDraftCost.record_step = record_step

# --- the engine -------------------------------------------------------------------------
orig_depth = LLMEngine._drafting_depth


def _drafting_depth(self, batch, limits, min_limit):
    CUR["lookahead"] = bool(self.lookahead)
    CUR["settles"] = bool(self._settles)
    CUR["ahead_present"] = self._ahead is not None
    hits, reused = self.stats.lookahead_hits, self.stats.lookahead_reused
    CUR["limits"] = f(np.asarray(limits))
    cm = self.verifier.cost_model
    n = batch.slots.shape[0]
    CUR["cm_state"] = dict(
        lines={k: [f(v[0]), f(v[1])] for k, v in cm.overhead_lines().items()},
        ratio={int(k): f(v) for k, v in cm._ratio.items()},
        one_depth={str(k): v for k, v in cm._one_depth.items()},
        time_scale=f(cm.time_scale),
        window_drafted=[(d, f(m)) for d, m, _ in cm._missed.get((n.bit_length(), False), [])],
    )
    depth = orig_depth(self, batch, limits, min_limit)
    CUR["lookahead_hit"] = self.stats.lookahead_hits - hits
    CUR["lookahead_reused"] = self.stats.lookahead_reused - reused
    CUR["final_depth"] = int(depth)
    CUR["overruled"] = bool(self._overruled)
    CUR["num_reqs"] = int(n)
    CUR["num_tokens"] = int(batch.num_tokens)
    return depth


LLMEngine._drafting_depth = _drafting_depth

orig_learn = LLMEngine._learn_outcome


def _learn_outcome(self, admitted, accepted):
    CUR["admitted"] = list(map(int, admitted))
    CUR["accepted"] = list(map(int, accepted))
    return orig_learn(self, admitted, accepted)


LLMEngine._learn_outcome = _learn_outcome

orig_step = LLMEngine.step


def step(self):
    adaptive = self.verifier is not None and self.gate is not None
    if adaptive:
        CUR.clear()
        CUR["phase"] = PHASE[0]
        CUR["step"] = self._step_index + 1
        CUR["settled_left_before"] = int(self._settled_left)
    if adaptive and not getattr(self, "_c4_hooked", False):
        acc = self.acceptance
        orig_update = acc.update

        def update(admitted, accepted, _orig=orig_update, _eng=self):
            CUR["admitted"] = [int(x) for x in admitted]
            CUR["accepted"] = [int(x) for x in accepted]
            rows = getattr(_eng, "_round_rows", None)
            CUR["fresh_rows"] = f(np.asarray(rows)) if rows is not None else None
            return _orig(admitted, accepted)

        acc.update = update
        self._c4_hooked = True
    out = orig_step(self)
    if adaptive and self.stats.step_log:
        from dspark.engine.engine import STEP_FIELDS

        row = self.stats.step_log[-1]
        CUR["measured"] = {k: f(v) for k, v in zip(STEP_FIELDS, row, strict=False)}
        CUR["budget"] = (
            int(self.stats.budgets[-1]) if self.stats.budgets and CUR.get("final_depth") else None
        )
        rec = {k: v for k, v in CUR.items() if k != "in_pays"}
        LOG.write(json.dumps(rec) + "\n")
        LOG.flush()
    return out


LLMEngine.step = step

if __name__ == "__main__":
    argv = ["bench", "--concurrency", "4", "--fixed", "1", "--step-log", "--out", OUT]
    argv += sys.argv[2:]
    args = build_parser().parse_args(argv)
    MEASURED_WINDOW_S[0] = args.window_s
    args.handler(args)
