#!/usr/bin/env bash
# One single-H200 call, in a clean working tree of the commit under test (CALL_ROOT=.): the decode kernel at the
# model's default context (max_seq_len 40,960) for every grid_splits of reports.decode_splits_bench's GRID_SWEEP,
# both split sizes, batches 1-64, contexts 600 and 4096: the data decode_attention's default grid is chosen from.
CALL_ROOT=. source reports/results/h200/call_lib.sh
run sweep 240 python -m reports.decode_splits_bench --sweep-grid --json "$R/decode_grid_sweep.json"
cat "$R/done.txt"
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
