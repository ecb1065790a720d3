"""How much ``AdaptiveVerifier.record_outcomes``' correction wanders, offline.

Feeds verified outcomes to a verifier, 16 or 64 requests a call, verified 3-7 deep at
random (budget cuts): first rounds of the published chat trace (perfectly calibrated by
construction, so any departure from 1 is estimation noise), then the 2,613 rounds the
shipped SmolLM2 drafter recorded on an H200, 16 at a time in their recorded order.
Prints the final correction per position and its range over the second half of the
calls, for the shipped memory and prior and for a shorter memory.

    PYTHONPATH=src python scripts/calibration_noise.py
"""

import numpy as np

import dspark.scheduling.verifier as verifier_module
from dspark.engine.replay import AcceptanceTrace
from dspark.scheduling.verifier import AdaptiveVerifier

ROUNDS = "docs/results/sim/c1_policy/rounds_smollm2_h200_48req.npz"


def main() -> None:
    trace = AcceptanceTrace.resolve("published:chat")
    recorded = np.load(ROUNDS)
    for decay, prior in (
        (verifier_module.CALIBRATION_DECAY, verifier_module.CALIBRATION_PRIOR),
        (0.999, 64.0),
    ):
        verifier_module.CALIBRATION_DECAY, verifier_module.CALIBRATION_PRIOR = decay, prior
        print(f"memory decay {decay} per request, prior {prior:g} slots")
        rng = np.random.default_rng(0)
        for batch in (16, 64):
            verifier = AdaptiveVerifier(4, 7, None, 1000)
            history = []
            for _ in range(2000 // batch * 8):
                picked = rng.integers(0, trace.confidences.shape[0], batch)
                admitted = rng.integers(3, 8, batch)
                accepted = np.minimum(trace.accepted[picked], admitted)
                verifier.record_outcomes(trace.confidences[picked], admitted, accepted)
                history.append(verifier.calibration)
            late = np.array(history[len(history) // 2 :])
            print(
                f"  calibrated rounds, {batch} a call: final {verifier.calibration.round(3)}"
                f"\n    range {late.min(0).round(3)} .. {late.max(0).round(3)}"
            )
        verifier = AdaptiveVerifier(4, 7, None, 1000)
        confidences, accepted = recorded["confidences"], recorded["accepted"]
        for start in range(0, accepted.shape[0], 16):
            rows = confidences[start : start + 16]
            verifier.record_outcomes(rows, np.full(rows.shape[0], 7), accepted[start : start + 16])
        print(f"  SmolLM2's H200 rounds, full K: final {verifier.calibration.round(3)}")
    survival = np.cumprod(confidences.astype(np.float64), axis=1).mean(axis=0)
    survived = np.array([(accepted > k).mean() for k in range(7)])
    print(f"SmolLM2's rounds overall: mean survival {survival.round(3)}")
    print(f"  share that survived {survived.round(3)}")
    print(f"  realised / predicted {(survived / survival).round(3)}")


if __name__ == "__main__":
    main()
