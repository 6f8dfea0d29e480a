#!/usr/bin/env python3
"""Greedy generation references for `trainrun sample --temperature 0`.

For the Hugging Face fixtures of make_hf_fixtures.py (tiny-llama: GQA and
rotary positions; tiny-qwen2: q/k/v biases, tied head; tiny-gpt2: learned
positions, packed attention), loads each directory with from_pretrained,
casts it to float64 and runs transformers' own greedy generate (do_sample
False, its key/value cache, the EOS ignored) from a fixed prompt to the
model's full context, and writes tests/fixtures/hf/generate.json:

  {"tiny-llama": {"ctx": 64, "prompt": [...], "ids": [...], "min_margin": m}, ...}

ids are the tokens generated after the prompt; min_margin is the smallest
gap, over the steps, between the largest and the second largest logit: an
implementation that computes the logits to within a fraction of it (fp32
against this float64 reference) must pick the same ids.  The prompt of
each model is the first of a fixed list whose generation keeps a margin of
at least 1e-4 (ties make a greedy id a matter of rounding), and whose ids are
not all one token (which would test little).

The ids are also checked against the argmax of a plain forward over the
whole sequence (no cache), so the reference does not rest on the cache.

Usage (the venv of tests/torch/README.md; nothing is downloaded):
  python3 tests/torch/make_generate_fixtures.py          # write generate.json
  python3 tests/torch/make_generate_fixtures.py --check  # recompute, compare
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures", "hf"))
OUT = os.path.join(FIXTURES, "generate.json")
MODELS = {"tiny-llama": 64, "tiny-qwen2": 32, "tiny-gpt2": 16}
PROMPTS = [[5, 17, 3, 9], [11, 2, 30, 7, 19], [1, 4, 9, 16, 25, 36], [8, 6, 7, 5, 3, 0, 9]]


def generate(name, ctx):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, name),
                                                 attn_implementation="eager")
    model = model.double().eval()
    vocab = model.config.vocab_size
    for prompt in PROMPTS:
        prompt = [t % vocab for t in prompt]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=ctx - len(prompt),
                                 min_new_tokens=ctx - len(prompt), do_sample=False,
                                 use_cache=True, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True)
            seq = out.sequences[0]
            whole = model(seq[None, :-1]).logits[0]
        new = seq[len(prompt):].tolist()
        plain = whole[len(prompt) - 1:].argmax(-1).tolist()
        assert plain == new, "%s: generate's ids are not the plain forward's argmax" % name
        margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores)
        if margin >= 1e-4 and len(set(new)) > 1:
            return {"ctx": ctx, "prompt": prompt, "ids": new, "min_margin": margin}
    sys.exit("%s: no prompt keeps a greedy margin of 1e-4" % name)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    result = {name: generate(name, ctx) for name, ctx in MODELS.items()}
    if a.check:
        with open(OUT) as f:
            kept = json.load(f)
        for name, r in result.items():
            assert kept[name]["ids"] == r["ids"], "%s: the ids changed" % name
        print("generate.json: the same ids")
        return
    with open(OUT, "w") as f:  # a model a line
        f.write("{\n" + ",\n".join(" %s: %s" % (json.dumps(name), json.dumps(r))
                                     for name, r in result.items()) + "\n}\n")
    for name, r in result.items():
        print("%s: %d ids after %d, min margin %.3g" % (name, len(r["ids"]), len(r["prompt"]),
                                                        r["min_margin"]))


if __name__ == "__main__":
    main()
