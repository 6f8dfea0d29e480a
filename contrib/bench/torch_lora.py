"""The peer of contrib/bench/lora.sh: PEFT LoRA over transformers, on the CPU.

    python3 torch_lora.py make DIR --config 135m|360m        # the model, once
    python3 torch_lora.py train DIR --rank 16 --batch 4 --ctx 256 --steps 8 --warmup 3 \
        --threads 2 [--bf16]

`make` builds the Llama-shaped model from its config with fixed random weights
(nothing is downloaded) and saves it with save_pretrained (fp32 safetensors):
both engines fine-tune that directory.  `train` runs what a PEFT user writes:
get_peft_model(LoraConfig(r, lora_alpha=2r, target_modules="all-linear",
lora_dropout=0)), AdamW on the trainable parameters, forward / cross-entropy /
backward / step on uniform random token ids, and prints
RESULT ms_per_step=... tokens_per_s=... (the steps after the warm-up ones).
--bf16 runs the forward under torch.autocast("cpu", torch.bfloat16), the CPU
mixed-precision path PyTorch offers (weights and adapters stay fp32, as
trainrun's bf16 policy keeps master weights).
"""
import argparse
import time

import torch

CONFIGS = {
    # SmolLM-135M's and SmolLM-360M's shapes
    "135m": dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, intermediate_size=1536),
    "360m": dict(vocab_size=49152, hidden_size=960, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5, intermediate_size=2560),
}


def make(a):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=2048, **CONFIGS[a.config])
    LlamaForCausalLM(cfg).save_pretrained(a.dir, safe_serialization=True)


def train(a):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                                             target_modules="all-linear"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        x = torch.randint(0, V, (a.batch, a.ctx), generator=g)
        y = torch.randint(0, V, (a.batch, a.ctx), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ms = 1000 * (time.perf_counter() - t0) / a.steps
    print("RESULT ms_per_step=%.1f tokens_per_s=%.1f" % (ms, a.batch * a.ctx * 1000 / ms))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["make", "train"])
    p.add_argument("dir")
    p.add_argument("--config", default="135m", choices=sorted(CONFIGS))
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    a = p.parse_args()
    make(a) if a.what == "make" else train(a)


if __name__ == "__main__":
    main()
