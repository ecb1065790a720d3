# Session 25 GPU calls: the 8B shape (acceptance REPLAYED from published:chat) on the
# current code at every level of the sweep, each against the fixed Ks earlier sessions
# found best there. Needs only .gpu/prompts.npz (random weights, nothing to stage).
#   bash scripts/gpu/session25.sh lo     1 and 4: K = 6 against adaptive, 24 requests,
#                                        REPEATS (3)
#   bash scripts/gpu/session25.sh hi     256: no spec, K = 5, 7 and adaptive, 512
#                                        requests, REPEATS256 (2)
#   bash scripts/gpu/session25.sh mid    64: K = 4, 5 and adaptive, 256 requests,
#                                        REPEATS (3)
#   bash scripts/gpu/session25.sh ab256  256: K = 5 against adaptive with and without the
#                                        look-ahead's budget shares (lookahead_shares),
#                                        512 requests, REPEATS256 (2)
#   OLD=.gpu/old21 bash scripts/gpu/session25.sh abtree
#                                        256: K = 5 against adaptive, one repeat a run,
#                                        alternating the package in $OLD/src (an older
#                                        commit's tree: git archive REV src | tar -x -C
#                                        $OLD; carry it) with this checkout's, in ORDER
#                                        ("new old new old"); each run's JSON in
#                                        $OUT/ab_<n>_<old|new>
# Several modes run in order (each under its own limit); each writes $OUT/b8_<mode>.
source scripts/gpu/b8_common.sh  # PYTHONPATH, OUT, $C
for mode in "$@"; do
  case "$mode" in
    lo) args="--repeats ${REPEATS:-3} --concurrency 4 1 --fixed 6 --min-requests 24 --no-baseline"
        limit=${LIMIT_LO:-200} ;;
    hi) args="--repeats ${REPEATS256:-2} --concurrency 256 --fixed 5 7 --min-requests 512"
        limit=${LIMIT_HI:-330} ;;
    mid) args="--repeats ${REPEATS:-3} --concurrency 64 --fixed 4 5 --min-requests 256 --no-baseline"
         limit=${LIMIT_MID:-300} ;;
    ab256) args="--repeats ${REPEATS256:-2} --concurrency 256 --fixed 5 --min-requests 512
                 --no-baseline --variant noshare:lookahead_shares=off"
           limit=${LIMIT_AB:-300} ;;
    abtree)
      n=0
      for v in ${ORDER:-new old new old}; do
        n=$((n + 1)); src=src; [ "$v" = old ] && src=$OLD/src
        PYTHONPATH=$src timeout ${LIMIT_RUN:-150} $C --repeats 1 --concurrency 256 --fixed 5 \
          --min-requests 512 --no-baseline --out /tmp/ab_$n 2>&1 | grep "^ 256\|concurrency 256"
        mkdir -p "$OUT/ab_${n}_$v"; cp /tmp/ab_$n/bench.json "$OUT/ab_${n}_$v/"
      done
      continue ;;
    *) echo "unknown mode $mode"; continue ;;
  esac
  timeout $limit $C $args --out "$OUT/b8_$mode" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -14
  rm -rf "$OUT/b8_$mode/profiles"
done
