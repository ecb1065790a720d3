"""Why adaptive verification leaves steps undrafted: every decision of one closed-loop run.

Runs the adaptive setting as ``dspark bench`` does (same engine settings and prompts, a
warm-up as long as the measured run) and logs, per measured step: the batch's slots,
the stale rows the cost model read (``AdaptiveVerifier``'s latest recorded survival,
before the predictiveness shrink), who decided (the cost model's depth, the gate's
answer and both arms' rate and standard error at that moment), the depth run, the
drafts admitted and accepted, the tokens emitted and the step's wall time. Prints a
summary (decision paths; tokens per ms by path; vetoes against the gate's figures;
the cost model's declines against what the same request's next drafted round gave)
and writes the log as JSON.

    MODEL=path.gguf PYTHONPATH=src python3 scripts/gpu/decision_log.py CONC REQUESTS TOKENS OUT.json
    python3 scripts/gpu/decision_log.py --summarise OUT.json   # again, from a saved log

``DEVICE=cpu`` runs on the CPU (fp32); ``WARMUP=short`` warms up as ``dspark bench`` does
without ``--full-warmup`` (``concurrency`` requests, a quarter of the tokens).
"""

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict

import numpy as np
import torch

from dspark.bench import sweep
from dspark.bench.sweep import Setting, bench_prompts, closed_loop, engine_for
from dspark.engine.sampling import SamplingParams
from dspark.models.loader import load_model
from dspark.scheduling import verifier as verifier_module
from dspark.scheduling.gate import DRAFTED, UNDRAFTED


def bench_args(max_tokens: int) -> argparse.Namespace:
    """``dspark bench``'s settings (its own parser and defaults) for this run."""
    parser = argparse.ArgumentParser()
    sweep.add_cli_args(parser)
    prompts = os.environ.get("PROMPTS", ".gpu/prompts.npz")
    argv = ["--device", os.environ.get("DEVICE", "cuda"), "--max-tokens", str(max_tokens)]
    argv += ["--out", "/tmp/decision-log"]
    if os.path.exists(prompts):
        argv += ["--prompts", prompts]
    return parser.parse_args(argv)


def arm_figures(gate, num_reqs, mixed):
    state = gate._get(num_reqs, mixed)
    judged = gate._judged(state, num_reqs, mixed)
    if judged is None:
        return None
    out = []
    for arm in (DRAFTED, UNDRAFTED):
        if not judged.samples[arm]:
            out.append(None)
        else:
            rate, error = judged.rate_and_error(arm)
            out.append([round(rate, 4), round(error, 4)])
    return out


def instrument(engine, log):
    gate, verifier = engine.gate, engine.verifier
    current: dict = {}
    priced: dict = {}  # the cost model's view at its latest drafting_pays (look-ahead or not)
    depth_rates = verifier_module.depth_rates

    def logged_rates(survival, verify_ms, num_sampling, draft_ms):
        rates = depth_rates(survival, verify_ms, num_sampling, draft_ms)
        priced["rates"] = np.round(rates, 4).tolist()
        priced["verify_ms"] = np.round(verify_ms[:8], 3).tolist()
        priced["draft_ms"] = np.round(draft_ms, 3).tolist()
        priced["survival"] = np.round(survival[0, :4], 3).tolist()
        return rates

    verifier_module.depth_rates = logged_rates
    should_draft, should_probe = gate.should_draft, gate.should_probe
    drafting_depth, record = engine._drafting_depth, verifier.record
    update, schedule, step = engine.acceptance.update, engine.scheduler.schedule, engine.step

    def logged_schedule(*a, **k):
        chunks = schedule(*a, **k)
        current["decode"] = bool(chunks) and all(c.is_decode for c in chunks)
        current["slots"] = [int(c.request.slot) for c in chunks]
        return chunks

    def logged_depth(batch, limits, *rest):
        slots = batch.slots
        current["stale"] = np.round(verifier._fresh.take(slots, axis=0)[:, :3], 3).tolist()
        current["unrecorded"] = verifier._unrecorded.take(slots).tolist()
        current["rho"] = round(float(verifier.predictiveness), 3)
        depth = drafting_depth(batch, limits, *rest)
        current["priced"] = dict(priced)  # the latest pricing: this step's, made now or ahead
        current["depth"] = int(depth)
        current["probe_depth"] = int(verifier.probe_depth)
        return depth

    def logged_draft(num_reqs, mixed=False):
        current["figures"] = arm_figures(gate, num_reqs, mixed)
        answer = should_draft(num_reqs, mixed)
        current["path"] = "model yes, gate yes" if answer else "model yes, gate veto"
        return answer

    def logged_probe(num_reqs, mixed=False):
        current["figures"] = arm_figures(gate, num_reqs, mixed)
        answer = should_probe(num_reqs, mixed)
        current["path"] = "model no, gate drafts" if answer else "model no, undrafted"
        return answer

    def logged_record(slots, confidences):
        current["conf"] = np.round(np.asarray(confidences)[:, :3], 3).tolist()
        return record(slots, confidences)

    def logged_update(admitted, accepted):
        current["admitted"] = np.asarray(admitted).tolist()
        current["accepted"] = np.asarray(accepted).tolist()
        return update(admitted, accepted)

    def logged_step():
        current.clear()
        generated, captures = engine.stats.num_generated, engine.num_captures()
        start = time.perf_counter()
        out = step()
        current["wall"] = round((time.perf_counter() - start) * 1e3, 3)
        current["tokens"] = engine.stats.num_generated - generated
        current["capture"] = engine.num_captures() > captures
        log.append(dict(current))
        return out

    engine.scheduler.schedule = logged_schedule
    engine._drafting_depth = logged_depth
    gate.should_draft, gate.should_probe = logged_draft, logged_probe
    verifier.record = logged_record
    engine.acceptance.update = logged_update
    engine.step = logged_step


def summarise(log):
    steps = [e for e in log if e.get("decode") and not e["capture"] and "path" in e]
    print(f"{len(steps)} decoding steps decided (of {len(log)} logged)")
    by_path = defaultdict(lambda: [0, 0.0, 0])
    for e in steps:
        row = by_path[e["path"]]
        row[0] += 1
        row[1] += e["wall"]
        row[2] += e["tokens"]
    print(f"{'path':>24} {'steps':>6} {'ms/step':>8} {'tok/step':>8} {'tok/ms':>7}")
    for path, (n, wall, tokens) in sorted(by_path.items()):
        print(f"{path:>24} {n:>6} {wall / n:>8.2f} {tokens / n:>8.2f} {tokens / wall:>7.3f}")
    vetoes = [e for e in steps if e["path"] == "model yes, gate veto" and e["figures"]]
    if vetoes:
        drafted = [e["figures"][0] for e in vetoes if e["figures"][0]]
        undrafted = [e["figures"][1] for e in vetoes if e["figures"][1]]
        d_rate, d_err = np.median(drafted, axis=0)
        u_rate, u_err = np.median(undrafted, axis=0)
        print(
            f"at vetoes, gate's drafted rate median {d_rate:.3f} (error {d_err:.3f}), "
            f"undrafted {u_rate:.3f} (error {u_err:.3f})"
        )
    # Runs of vetoes: how long the gate stays off once it turns drafting off.
    runs, run = [], 0
    for e in steps:
        if e["path"] == "model yes, gate veto":
            run += 1
        elif e["path"] == "model yes, gate yes" and run:
            runs.append(run)
            run = 0
    if run:
        runs.append(run)
    print(f"veto runs (consecutive model-yes steps vetoed): {sorted(runs, reverse=True)[:20]}")
    # Declines by the cost model at one request: the stale first position, and the same
    # request's next drafted round.
    declines = [e for e in steps if e["path"].startswith("model no") and len(e["slots"]) == 1]
    if declines:
        stale = np.array([e["stale"][0][0] for e in declines])
        unrec = sum(e["unrecorded"][0] for e in declines)
        print(
            f"model declines at one request: {len(declines)}, stale c1 quartiles "
            f"{np.percentile(stale, [25, 50, 75]).round(3).tolist()}, unrecorded {unrec}"
        )
    print_prediction_check(steps)
    drafted = [e for e in steps if "admitted" in e and sum(e["admitted"]) > 0]
    if drafted:
        admitted = sum(sum(e["admitted"]) for e in drafted)
        accepted = sum(sum(e["accepted"]) for e in drafted)
        first = [
            (e["conf"][i][0], int(e["accepted"][i] > 0))
            for e in drafted
            if "conf" in e
            for i in range(min(len(e["conf"]), len(e["accepted"])))
            if e["admitted"][i] > 0
        ]
        if first:
            conf, hit = np.array(first).T
            print(
                f"drafted rounds: {len(first)}, mean c1 {conf.mean():.3f}, first draft "
                f"accepted {hit.mean():.3f}; {accepted} of {admitted} admitted drafts accepted"
            )
    depth = Counter(e["depth"] for e in steps)
    print("depths run:", dict(sorted(depth.items())))
    if all(len(e["slots"]) == 1 for e in steps):
        print_by_request(steps)


def print_prediction_check(steps):
    """One request at a time, logs with the cost model's pricing (``priced``): the first
    position's predicted survival at each decision against whether the first draft of
    the same request's next drafted round was accepted, for declines and for drafting."""
    if not all(len(e["slots"]) == 1 for e in steps) or not any(e.get("priced") for e in steps):
        return
    pairs = defaultdict(list)
    for i, e in enumerate(steps):
        if not e.get("priced"):
            continue
        for later in steps[i + 1 :]:
            if later["unrecorded"][0] and not e["unrecorded"][0]:
                break  # the next request (a batch of one: slot reused)
            if later["depth"] and later.get("admitted") and later["admitted"][0] > 0:
                kind = "declines" if e["path"].startswith("model no") else "model drafts"
                accepted = later["accepted"][0] > 0
                pairs[kind].append((e["priced"]["survival"][0], accepted))
                break
    for kind, values in sorted(pairs.items()):
        predicted, accepted = np.array(values, dtype=float).T
        print(
            f"{kind}: {len(values)} with a later drafted round; predicted first-position "
            f"survival {predicted.mean():.3f}, that round's first draft accepted "
            f"{accepted.mean():.3f}"
        )


PATH_MARKS = {
    "model yes, gate yes": "D",
    "model yes, gate veto": "v",
    "model no, undrafted": ".",
    "model no, gate drafts": "p",
}


def print_by_request(steps):
    """One request at a time: each request's decisions in order (D drafted as the cost
    model chose, v vetoed by the gate, . declined by the cost model, p declined but
    drafted by the gate), its tokens per ms and its chosen drafted steps' tokens per ms.
    A request starts where its slot has no recorded round yet."""
    requests, current, before = [], [], False
    for e in steps:
        unrecorded = e["unrecorded"][0]
        if unrecorded and not before and current:
            requests.append(current)
            current = []
        current.append(e)
        before = unrecorded
    requests.append(current)
    print(f"by request ({len(requests)}): steps, tokens/ms, chosen drafted steps' tokens/ms")
    for steps_of in requests:
        chosen = [e for e in steps_of if e["path"] == "model yes, gate yes"]
        rate = sum(e["tokens"] for e in steps_of) / sum(e["wall"] for e in steps_of)
        chosen_wall = sum(e["wall"] for e in chosen)
        chosen_rate = sum(e["tokens"] for e in chosen) / chosen_wall if chosen else 0.0
        marks = "".join(PATH_MARKS[e["path"]] for e in steps_of)
        print(f"{len(steps_of):4d} {rate:.3f} {chosen_rate:.3f} {marks}")


def main() -> None:
    if sys.argv[1:2] == ["--summarise"]:  # a saved log
        with open(sys.argv[2]) as f:
            summarise(json.load(f))
        return
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    args = bench_args(int(sys.argv[3]) if len(sys.argv) > 3 else 128)
    out_path = sys.argv[4] if len(sys.argv) > 4 else "/tmp/decision_log.json"
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    loaded = load_model(os.environ.get("MODEL"), dtype, args.device)
    prompts = bench_prompts(loaded.tokenizer, args, 2 * count)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    engine = engine_for(loaded, Setting("adaptive", 7), concurrency, args)
    if os.environ.get("WARMUP") == "short":  # as dspark bench without --full-warmup
        warm = SamplingParams(temperature=0.0, max_tokens=max(4, args.max_tokens // 4))
        closed_loop(engine, prompts[:concurrency], warm, concurrency)
    else:
        closed_loop(engine, prompts[:count], params, concurrency)  # as --full-warmup
    engine.stats.__init__()
    log: list = []
    instrument(engine, log)
    finished, seconds = closed_loop(engine, prompts[count:], params, concurrency)
    tokens = sum(len(r.output_ids) for r in finished)
    rate = tokens / seconds
    print(f"adaptive c{concurrency}: {tokens} tokens in {seconds:.2f} s ({rate:.1f} tok/s)")
    summarise(log)
    with open(out_path, "w") as f:
        json.dump(log, f)


if __name__ == "__main__":
    main()
