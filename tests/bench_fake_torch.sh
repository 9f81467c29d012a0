#!/usr/bin/env bash
# A stand-in for "python with torch" (bench/run --python): answers bench/run's torch probe, and
# for bench/torch/train.py prints one result line whose step time depends on the variant
# (channels-last with the tuned malloc fastest: 10 ms + the round, others 20 + round), logging
# each call with its malloc environment to $FAKE_TORCH_LOG. tests/bench_cli.sh uses it.
set -u
if [ "${1:-}" = -c ]; then
    echo '{"version": "fake", "file": "/nonexistent", "cuda": false, "cuda_device": "",
           "bf16": false, "threads": 2}' | tr -d '\n'; echo
    exit 0
fi
malloc="${MALLOC_MMAP_THRESHOLD_:-}/${MALLOC_TRIM_THRESHOLD_:-}/${MALLOC_TOP_PAD_:-}"
[ "$malloc" = // ] && malloc=default
echo "$(basename "$1") ${*:2} malloc=$malloc" >>"$FAKE_TORCH_LOG"
round=$(( $(wc -l <"$FAKE_TORCH_LOG") - 1 ))
round=$(( round / 4 ))  # 4 variants a round (the calls of one round are consecutive)
ms=$((20 + round))
case "$* $malloc" in *channels_last*4000000000*) ms=$((10 + round)) ;; esac
echo "{\"key\": \"fake\", \"impl\": \"pytorch\", \"step_ms\": {\"median\": $ms, \"min\": $ms, \"max\": $ms}, \"images_per_s\": $((128000 / ms)), \"peak_rss_mib\": 500, \"base_rss_mib\": 400}"
