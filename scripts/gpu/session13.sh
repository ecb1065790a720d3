# Session 13's GPU calls (dl, c1, c4_16, c64): session14.sh's, with 24 requests at one.
C1_REQUESTS=24 exec bash scripts/gpu/session14.sh "$@"
