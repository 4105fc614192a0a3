#!/usr/bin/env bash
# run 45c: on 45b's machine, kept warm: run 44's admission hold (A) against the hold with
# --fused-finish pad_first (B), 64 streams, closed loop, 30-s levels B A A B B A B A as far as
# DEADLINE_S allows (run 45a's script).
HOLD="--native-admit-hold-ms 30 --native-admit-hold-requests 8 --native-admit-hold-min-rows 32"
A_ARGS="$HOLD" B_ARGS="$HOLD --fused-finish pad_first" ORDER="B A A B B A B A" bash docs/bench/run45/a/command.sh
