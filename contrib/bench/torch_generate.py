"""Greedy generation with transformers, the peer of contrib/bench/sample.sh.

    python3 torch_generate.py DIR --prompt "1 2 3" --tokens N --threads T [--bf16]

Loads the Hugging Face directory DIR (AutoModelForCausalLM, fp32, or bf16
with --bf16), generates N tokens after the prompt's ids greedily
(do_sample=False, with its key/value cache, the EOS ignored: min_new_tokens=N)
and prints the ids, then one line
    RESULT load_s=... generate_s=... first_s=... tokens_per_s=... tokens=N
with the seconds from_pretrained and generate took, the seconds to the
first new token (the prompt's forward with it) and the tokens per second
after it (a streamer notes when each token comes), as trainrun sample logs them.
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer


class Clock(BaseStreamer):
    """When generate hands over the prompt (first) and each new token."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--prompt", required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        a.dir, torch_dtype=torch.bfloat16 if a.bf16 else torch.float32)
    model.eval()
    t1 = time.perf_counter()
    ids = torch.tensor([[int(x) for x in a.prompt.split()]])
    clock = Clock()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.tokens,
                             min_new_tokens=a.tokens, do_sample=False, use_cache=True,
                             pad_token_id=0, streamer=clock)
    t2 = time.perf_counter()
    print(" ".join(str(int(x)) for x in out[0].tolist()))
    tk = clock.times  # [prompt, token 1, ..., token N]
    rate = (len(tk) - 2) / (tk[-1] - tk[1]) if len(tk) > 2 else 0.0
    print("RESULT load_s=%.3f generate_s=%.3f first_s=%.3f tokens_per_s=%.1f tokens=%d"
          % (t1 - t0, t2 - t1, tk[1] - t1, rate, a.tokens))


if __name__ == "__main__":
    main()
