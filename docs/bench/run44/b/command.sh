#!/usr/bin/env bash
# run 44b: run 44a's A/B again on 44a's machine, still warm (the device tool reuses it: the
# checkpoint and compile caches are there), the servers loaded anew: closed-loop levels
# A B B A, then open loops of 50-frame clips (Poisson, 12-s levels, 128 streams) at 70 and
# 80 req/s on each, then 20 req/s, then more closed levels, as far as DEADLINE_S allows.
ORDER="A B B A A@70 B@70 B@80 A@80 A@20 B@20 B A" bash docs/bench/run44/a/command.sh
