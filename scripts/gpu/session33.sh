# Session 33 GPU calls: the 8B shape (acceptance REPLAYED from published:chat) on the
# current code, every level of the sweep, against the fixed Ks earlier sessions found
# best there. Since the last 8B runs (session 28 at 4-256, session 25 at 1) the gate
# judges a batch of one over 128 steps an arm and its step is O(1) (sessions 31-32).
# Needs only .gpu/prompts.npz (random weights, nothing to stage).
#   bash scripts/gpu/session33.sh one   1: no spec, K = 6 and adaptive, 24 requests,
#                                       REPEATS1 (5)
#   bash scripts/gpu/session33.sh four  4: K = 6 and adaptive, 24 requests, REPEATS4 (2)
#   bash scripts/gpu/session33.sh hi    256: no spec, K = 5, 7 and adaptive, 512 requests,
#                                       REPEATS256 (2)
#   bash scripts/gpu/session33.sh c16   16: K = 7 and adaptive, 48 requests, REPEATS16 (3)
#   bash scripts/gpu/session33.sh c64   64: K = 5 and adaptive, 256 requests, REPEATS64 (2)
#   OLD=.gpu/old28 ORDER="old new" bash scripts/gpu/session33.sh abtree16
#                                       16 on an older tree ("old", $OLD/src) and this
#                                       one ("new"), in ORDER, one bench call each; any
#                                       other name runs the tree in .gpu/<name>/src
# Several modes run in order, each under its own limit (LIMIT_<MODE>, seconds); each
# writes $OUT/b8_<mode> (bench.json, bench.png, the log's table as table.txt).
source scripts/gpu/b8_common.sh  # PYTHONPATH, OUT, $C
for mode in "$@"; do
  case "$mode" in
    one) args="--repeats ${REPEATS1:-5} --concurrency 1 --fixed 6 --min-requests 24"
         limit=${LIMIT_ONE:-400} ;;
    four) args="--repeats ${REPEATS4:-2} --concurrency 4 --fixed 6 --min-requests 24 --no-baseline"
          limit=${LIMIT_FOUR:-120} ;;
    hi) args="--repeats ${REPEATS256:-2} --concurrency 256 --fixed 5 7 --min-requests 512"
        limit=${LIMIT_HI:-340} ;;
    c16) args="--repeats ${REPEATS16:-3} --concurrency 16 --fixed 7 --min-requests 48 --no-baseline"
         limit=${LIMIT_C16:-160} ;;
    c64) args="--repeats ${REPEATS64:-2} --concurrency 64 --fixed 5 --min-requests 256 --no-baseline"
         limit=${LIMIT_C64:-210} ;;
    abtree16)
      # 16: K = 7 against adaptive (48 requests, REPEATS16 repeats) once per entry of
      # ORDER, "old" running the package in $OLD/src (git archive REV src | tar -x -C
      # $OLD; carry it), "new" this checkout's; each run's files in $OUT/ab16_<n>_<v>.
      n=0
      for v in ${ORDER:-old new}; do
        n=$((n + 1)); src=src
        [ "$v" = old ] && src=$OLD/src
        [ "$v" != old ] && [ "$v" != new ] && src=.gpu/$v/src  # another tree under .gpu/
        PYTHONPATH=$src timeout ${LIMIT_RUN:-120} $C --repeats ${REPEATS16:-3} --concurrency 16 \
          --fixed 7 --min-requests 48 --no-baseline --out "$OUT/ab16_${n}_$v" 2>&1 \
          | grep "^  16\|concurrency 16"
        # bench.json only: a call brings back a limited number of files.
        rm -rf "$OUT/ab16_${n}_$v/profiles" "$OUT/ab16_${n}_$v/bench.png" \
          "$OUT/ab16_${n}_$v/bench.partial.json"
      done
      continue ;;
    *) echo "unknown mode $mode"; continue ;;
  esac
  start=$(date +%s)
  timeout $limit $C $args --out "$OUT/b8_$mode" 2>&1 | grep -v "it/s\]\|s/it\]" \
    | tee "$OUT/b8_$mode.log" | tail -14
  echo "mode $mode: $(( $(date +%s) - start )) s"
  rm -rf "$OUT/b8_$mode/profiles"
done
