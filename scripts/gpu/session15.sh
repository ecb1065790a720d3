# Session 15 GPU calls, after the stage_piece.sh calls (the GGUF quarters parked).
#   bash scripts/gpu/session15.sh ab     A/B at 16 and 4 of the engine and gate against
#                                        e960159's (.gpu/old, scripts/gpu/ab_files.sh)
#   bash scripts/gpu/session15.sh c1     the c1 bench alone (C1_REQUESTS, default 36)
#   bash scripts/gpu/session15.sh MODE   session14.sh's MODE (c4_16, c64, trace, ...)
source scripts/gpu/env.sh
set +e +o pipefail
export G OUT
case "$1" in
  ab)
    nvidia-smi --query-gpu=name --format=csv,noheader
    git log --oneline | head -1
    CONC="${CONC:-16 4}" ROUNDS=${ROUNDS:-2} MINREQ=${MINREQ:-48} bash scripts/gpu/ab_files.sh
    ;;
  c1)
    DECISION_LOG=0 bash scripts/gpu/session14.sh c1
    ;;
  *)
    bash scripts/gpu/session14.sh "$1"
    ;;
esac
