#!/bin/bash
# Greedy on prompts that are not in the repository: target alone, transformers UAG, hf_hetspec, one thread.
# /tmp/v524: a venv with transformers 5.24 over the project venv (5.25's UAG fails on this pair).
cd /work/main
OUT=${OUT:-/tmp/own}; mkdir -p "$OUT"  # where the JSON files go
i=0
while IFS= read -r -d $'\0' p; do
  i=$((i+1))
  for dt in float32; do
    echo "=== prompt $i $dt load $(cut -d' ' -f1-3 /proc/loadavg)"
    /tmp/v524/bin/python -m hf_hetspec.tools.cli generate --target qwen2.5-coder-1.5b-instruct --drafter smollm2-135m-instruct \
      --compare --json --threads 1 --max-new-tokens 64 --dtype $dt "$p" > "$OUT/p${i}_${dt}.json" 2> "$OUT/p${i}_${dt}.err"
    echo "rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done < <(printf '%s\0' \
 "Write a bash one-liner that prints the number of lines of every .py file under the current directory, largest first." \
 "Translate into German: The meeting has moved to Thursday afternoon because the projector in room 4 is broken." \
 $'Here is a Python function:\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n\nRewrite it so that it raises ValueError on an empty list and keeps everything else the same.' \
 "Explain in three sentences why the sky looks blue in the day and red at sunset.")
