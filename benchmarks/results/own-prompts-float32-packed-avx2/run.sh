#!/bin/bash
# After float32 packing (2026-12-04 afternoon): the same four prompts and commands as ../own-prompts-float32-avx2/run.sh
# (greedy, target alone, transformers UAG from /tmp/v524 = transformers 5.24 over the project venv, hf_hetspec, one thread).
OUT=/tmp/own2 exec bash /work/main/benchmarks/results/own-prompts-float32-avx2/run.sh
