"""float32 Qwen2.5-Coder-1.5B on its own layers (hetspec_target="eager"): the measured v, and hf_hetspec against
the target alone, greedy, 64 tokens, one thread, prompt 1 of run.sh; interleaved ROUNDS times (default 2)."""
import json, os, time, torch
torch.set_num_threads(1)
import hf_hetspec
from hf_hetspec.tools import zoo
from hf_hetspec.intersection import cache_root
target, ttok = zoo.load("qwen2.5-coder-1.5b-instruct", dtype=torch.float32)[:2]
drafter, dtok = zoo.load("smollm2-135m-instruct", dtype=torch.float32)[:2]
prompt = "Write a bash one-liner that prints the number of lines of every .py file under the current directory, largest first."
ids = ttok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
stop = [ttok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
common = dict(max_new_tokens=64, do_sample=False, eos_token_id=stop)
print("load", os.getloadavg(), flush=True)
hf_hetspec.enable(target)
def run_plain():
    hf_hetspec.disable(target)
    s = time.perf_counter(); out = target.generate(ids, **common); t = time.perf_counter() - s
    hf_hetspec.enable(target); return out, t
def run_hs():
    s = time.perf_counter()
    out = target.generate(ids, assistant_model=drafter, tokenizer=ttok, assistant_tokenizer=dtok, hetspec_target="eager", **common)
    return out, time.perf_counter() - s, hf_hetspec.last_stats(target)
first, t_first, st = run_hs()
print(f"first hf_hetspec call (measures v): {t_first:.1f} s; stored:", (cache_root() / "verify_costs.json").read_text(), flush=True)
for r in range(int(os.environ.get('ROUNDS', '2'))):
    plain, tp = run_plain()
    out, th, st = run_hs()
    same = torch.equal(plain, out)
    print(f"round {r}: target alone {tp:.1f} s, hf_hetspec eager {th:.1f} s ({tp/th:.2f}x), identical={same}, new={st.new_tokens} "
          f"drafted={st.drafted_tokens} accepted={st.accepted_tokens} forwards={st.target_forwards} backed_off={st.backed_off} "
          f"runtime={st.target_runtime} target_s={st.target_s:.1f} total_s={st.total_s:.1f} load={os.getloadavg()[0]:.2f}", flush=True)
