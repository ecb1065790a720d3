# The SmolLM2 drafter's pipeline on the GPU machine, one stage a call (each fits a call's
# 10 minutes), from the repository root, with the GGUF staged (scripts/gpu/split_gguf.sh):
#
#   bash scripts/gpu/drafter.sh distill   the engine answers every user turn of the
#                                         training conversations (.gpu/turns.json.xz, from
#                                         python -m dspark.train.distill pack), after an A/B
#                                         against the padded decoder; held-out splits too
#   bash scripts/gpu/drafter.sh train     the capacity and loss variants side by side on
#                                         that data (resumes any that were cut off)
#   bash scripts/gpu/drafter.sh eval      acceptance in the engine (ShareGPT, HumanEval,
#                                         T = 0 and 1), calibration, and dspark bench
#                                         against the shipped drafter at 1 and 64 requests
#
# Data and checkpoints stay under /root/stage while the machine is warm; what comes back
# is packed into $OUT (pieces of at most 15 MiB).
set +e +o pipefail
OUT=${OUT:-/tmp/out}
source scripts/gpu/env.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
DATA=/root/stage/data RUNS=/root/stage/runs
MINUTES=${MINUTES:-5}
# name: train-drafter arguments (the DFlash ablation has no Markov or confidence head)
VARIANTS=${VARIANTS:-"tv-l2:--loss tv --layers 2
kl-l2:--loss kl --layers 2
kl-l3:--loss kl --layers 3
kl-l5:--loss kl --layers 5
dflash-l5:--loss kl --layers 5 --no-heads"}
STEPS=${STEPS:-2400}

pack() {  # NAME PATH...: a tarball of PATHs cut into $OUT/NAME.tgz.*
  tar czf "/tmp/$1.tgz" "${@:2}" && split -b 15M -d "/tmp/$1.tgz" "$OUT/$1.tgz." && rm "/tmp/$1.tgz"
}

case "$1" in
  distill)
    [ -f "$G" ] || { echo "no staged GGUF at $G"; exit 1; }
    timeout 470 python3 -m dspark.cli distill --model "$G" --dtype bfloat16 \
      --turns .gpu/turns.json.xz --out $DATA --max-num-seqs 512 \
      --minutes "$MINUTES" --compare ${COMPARE:-256} 2>&1 | grep -v "turn/s\]\|it/s\]" | tail -8
    # the held-out splits (first turns of calib and eval), made once for every variant
    timeout 120 python3 -m dspark.cli train-drafter --model "$G" --dtype bfloat16 \
      --out /root/stage/heldout --data $DATA --prompts .gpu/prompts.npz --steps 1 \
      --eval-every 1000 2>&1 | grep "\[dspark\]"
    cp $DATA/distill.json "$OUT/"
    (cd /root/stage && pack data data/train.npz data/train.sampled.npy data/calib.npz data/eval.npz)
    ;;
  train)
    mkdir -p $RUNS
    while IFS= read -r line; do
      name=${line%%:*} flags=${line#*:}
      if [ -f "$RUNS/$name/checkpoint/state.pt" ]; then
        args=(--resume "$RUNS/$name")
      else
        args=(--model "$G" --dtype bfloat16 --out "$RUNS/$name" --data $DATA $flags
          --steps $STEPS --batch-size 16 --anchors 32 --max-length 1600 --eval-every 200
          --checkpoint-every 200 --intermediate ${INTERMEDIATE:-1024})
      fi
      python3 -m dspark.cli train-drafter "${args[@]}" --max-minutes ${TRAIN_MINUTES:-8} \
        > "$RUNS/$name.log" 2>&1 &
    done <<< "$VARIANTS"
    wait
    for f in $RUNS/*.log; do echo "== $f"; grep -a "step \|saved\|Error\|error" "$f" | tail -4; done
    (cd $RUNS && pack drafters */drafter.json */drafter.safetensors */history.json */training.png)
    ;;
  eval)
    names=$(cd $RUNS && ls -d */ | tr -d / | tr '\n' ' ')
    drafters=(--drafter shipped=src/dspark/data/drafters/SmolLM2-135M-Instruct)
    for n in $names; do drafters+=(--drafter "$n=$RUNS/$n"); done
    mkdir -p "$OUT/eval"
    timeout 300 python3 -m dspark.cli eval-drafter --model "$G" --dtype bfloat16 \
      --prompts .gpu/prompts.npz "${drafters[@]}" --num-prompts ${PROMPTS:-96} \
      --out "$OUT/eval" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -40
    for n in ${CALIBRATE:-}; do
      timeout 120 python3 -m dspark.cli calibrate --model "$G" --dtype bfloat16 \
        --prompts .gpu/prompts.npz --drafter "$RUNS/$n" --report "$OUT/calib-$n" 2>&1 | tail -3
    done
    for n in ${BENCH:-}; do
      for c in 1 64; do
        timeout 150 python3 -m dspark.cli bench --model "$G" --device cuda --dtype bfloat16 \
          --prompts .gpu/prompts.npz --drafter "$RUNS/$n" --concurrency $c --fixed 3 5 7 \
          --repeats 2 --window-s 4 --min-requests $(( c * 2 )) --full-warmup --freeze-gc \
          --out "$OUT/bench-$n/c$c" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -6
      done
    done
    (cd $RUNS && pack calibrated */drafter.json)
    ;;
  *) echo "usage: bash scripts/gpu/drafter.sh distill|train|eval" ;;
esac
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
true
