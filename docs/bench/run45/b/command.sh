#!/usr/bin/env bash
# run 45b: on a fresh machine, the default configuration (A, finished streams' last chunks split
# and ranked with the due ones) against the same with --fused-finish pad_first (B: a finished
# stream's rest in one padded call, ranked before the due streams), no admission hold: open
# loops of 50-frame clips at 70 req/s (Poisson, 12-s levels, 128 streams) on each, then
# 64-stream closed-loop levels, as far as DEADLINE_S allows (run 45a's script).
A_ARGS="" B_ARGS="--fused-finish pad_first" ORDER="B@70 A@70 B A A B" bash docs/bench/run45/a/command.sh
