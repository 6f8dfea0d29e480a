#!/usr/bin/env python3
"""The input files of llm.c's train_gpt2.c, made up for a benchmark (used by llmc.sh).

    llmc_inputs.py OUTDIR TEXT [--vocab 50257 --padded-vocab 50304 --layers 12
                                --heads 12 --dim 768 --max-t 1024 --seed 1]

writes, under OUTDIR, the paths train_gpt2.c opens relative to its working
directory:

  gpt2_124M.bin   a randomly initialised GPT-2 in llm.c's checkpoint format
                  (gpt2_build_from_checkpoint): 256 int32s of header (magic
                  20240326, version 3, maxT, V, L, NH, C, Vp), then the fp32
                  parameters in fill_in_parameter_sizes' order: wte (Vp x C, the
                  padding rows zero), wpe, ln1w, ln1b, qkvw, qkvb, attprojw,
                  attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb.
                  Layernorm weights 1, biases 0, the rest normal(0, 0.02) drawn
                  once into a 1 Mi-value pool and repeated: the values do not
                  change a step's time or memory, only that they are finite.
  dev/data/tinyshakespeare/tiny_shakespeare_train.bin, ..._val.bin
                  token files in llm.c's dataloader format (llmc/dataloader.h):
                  256 int32s of header (magic 20240520, version 1, token count),
                  then uint16 tokens: TEXT's bytes (ids 0-255, which are GPT-2's
                  byte tokens), the first 90% for training, the rest validation.

No gpt2_tokenizer.bin: train_gpt2.c warns and trains without it (it only
decodes sampled text, which llmc.sh switches off).  Standard library only;
the files are in the machine's byte order, as train_gpt2.c reads them.
"""
import argparse
import array
import os
import random
import sys

MODEL_MAGIC, MODEL_VERSION = 20240326, 3
DATA_MAGIC, DATA_VERSION = 20240520, 1
POOL = 1 << 20


def write_header(f, values):
    header = array.array("i", values + [0] * (256 - len(values)))
    f.write(header.tobytes())


def write_checkpoint(path, V, Vp, L, NH, C, maxT, seed):
    rng = random.Random(seed)
    pool = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(POOL)))
    pool_bytes = pool.tobytes()
    offset = [0]

    def normal(f, n):  # n values of the pool, continuing where the last tensor stopped
        while n > 0:
            o = offset[0]
            k = min(n, POOL - o)
            f.write(pool_bytes[4 * o:4 * (o + k)])
            offset[0] = (o + k) % POOL
            n -= k

    def const(f, n, v):
        block = array.array("f", [v]) * min(n, POOL)
        while n > 0:
            k = min(n, POOL)
            f.write(block[:k].tobytes())
            n -= k

    with open(path, "wb") as f:
        write_header(f, [MODEL_MAGIC, MODEL_VERSION, maxT, V, L, NH, C, Vp])
        normal(f, V * C)                # wte, the real vocabulary's rows
        const(f, (Vp - V) * C, 0.0)     # wte, padding rows (zero, as llm.c writes them)
        normal(f, maxT * C)             # wpe
        const(f, L * C, 1.0)            # ln1w
        const(f, L * C, 0.0)            # ln1b
        normal(f, L * 3 * C * C)        # qkvw
        const(f, L * 3 * C, 0.0)        # qkvb
        normal(f, L * C * C)            # attprojw
        const(f, L * C, 0.0)            # attprojb
        const(f, L * C, 1.0)            # ln2w
        const(f, L * C, 0.0)            # ln2b
        normal(f, L * 4 * C * C)        # fcw
        const(f, L * 4 * C, 0.0)        # fcb
        normal(f, L * C * 4 * C)        # fcprojw
        const(f, L * C, 0.0)            # fcprojb
        const(f, C, 1.0)                # lnfw
        const(f, C, 0.0)                # lnfb
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


def write_tokens(path, data):
    tokens = array.array("H", list(data))  # one token a byte (not the bytes as raw uint16s)
    with open(path, "wb") as f:
        write_header(f, [DATA_MAGIC, DATA_VERSION, len(tokens)])
        f.write(tokens.tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdir")
    p.add_argument("text", help="a file whose bytes become the tokens")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--padded-vocab", type=int, default=50304)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--max-t", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if a.padded_vocab < a.vocab or a.vocab < 256 or a.dim % a.heads:
        sys.exit("llmc_inputs.py: need padded-vocab >= vocab >= 256 and dim a multiple of heads")

    with open(a.text, "rb") as f:
        data = f.read()
    split = len(data) * 9 // 10
    if len(data) - split < 4096:
        sys.exit("llmc_inputs.py: %s is too short (%d bytes): its last 10%% must hold a "
                 "few batches of tokens" % (a.text, len(data)))
    datadir = os.path.join(a.outdir, "dev", "data", "tinyshakespeare")
    os.makedirs(datadir, exist_ok=True)
    write_tokens(os.path.join(datadir, "tiny_shakespeare_train.bin"), data[:split])
    write_tokens(os.path.join(datadir, "tiny_shakespeare_val.bin"), data[split:])
    n = write_checkpoint(os.path.join(a.outdir, "gpt2_124M.bin"), a.vocab, a.padded_vocab,
                         a.layers, a.heads, a.dim, a.max_t, a.seed)
    print("%d parameters (%.1f MiB), %d training and %d validation tokens"
          % (n, n * 4 / 2**20, split, len(data) - split))


if __name__ == "__main__":
    main()
