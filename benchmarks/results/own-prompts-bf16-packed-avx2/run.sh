#!/bin/bash
# Greedy on five more prompts that are not in the repository (none of the float32 runs' four), bf16 target (the
# bench's and demo's dtype; on this AVX2 CPU its layers run packed), one thread: target alone, transformers UAG,
# hf_hetspec, one `hf-hetspec generate --compare` per prompt.
# /tmp/v524: a venv with transformers 5.24 over the project venv (5.25's UAG fails on this pair).
cd /work/main
OUT=${OUT:-/tmp/own-bf16}; mkdir -p "$OUT"  # where the JSON files go
PY=${PY:-/tmp/v524/bin/python}
i=0
while IFS= read -r -d $'\0' p; do
  i=$((i+1))
  echo "=== prompt $i load $(cut -d' ' -f1-3 /proc/loadavg)"
  $PY -m hf_hetspec.tools.cli generate --target qwen2.5-coder-1.5b-instruct --drafter smollm2-135m-instruct \
    --compare --json --threads 1 --max-new-tokens 64 --dtype bfloat16 "$p" > "$OUT/p${i}.json" 2> "$OUT/p${i}.err"
  echo "rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)"
done < <(printf '%s\0' \
 "Write a SQL query that returns the five customers with the highest total order value, given tables customers(id, name) and orders(id, customer_id, amount)." \
 "Quelle est la différence entre une liste et un tuple en Python ? Réponds en deux phrases." \
 $'Summarize in one sentence: The city council voted on Tuesday to extend the bike lane on Harbor Street by two kilometres. Construction starts in March and should take six weeks. During that time the street will be closed to cars between 9 am and 4 pm, and buses will be rerouted through Mill Road.' \
 "A train leaves at 3:40 pm and travels 210 km at 84 km/h. At what time does it arrive? Show the steps." \
 $'Complete this function:\n\ndef is_palindrome(s: str) -> bool:\n    """Return True if s reads the same forwards and backwards, ignoring case and anything that is not a letter."""\n')
