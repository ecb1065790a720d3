"""``dspark bench`` with adaptive's drafting switched off: every decision undrafted, the
gate's probes off. What adaptive's undrafted steps cost beyond no speculation (the
drafter's context kept up to date, the captured layers, the scheduling), with nothing
drafted to blur it.

    PYTHONPATH=src python scripts/cpu_undrafted_ab.py bench --concurrency 4 --fixed \
        --repeats 4 --out OUT

Session 34 on this CPU: 0.988x no speculation (paired 0.989, 0.906-1.084 over four
repeats; ``docs/results/bench/cpu_session34_c4never``), where adaptive as it decides ran
0.861x (paired 0.858, drafting in about a third of the steps;
``docs/results/bench/cpu_session34_c4ns``): at 4 requests the loss is in the decisions
to draft, not in keeping the drafter ready.
"""

import sys

from dspark.cli import main
from dspark.scheduling import gate
from dspark.scheduling.verifier import AdaptiveVerifier

AdaptiveVerifier.drafting_pays = lambda self, *args, **kwargs: 0
gate.ThroughputGate.should_probe = lambda self, *args, **kwargs: False

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
