#!/usr/bin/env python3
"""Make tests/fixtures/tokenizer: a small byte-level BPE tokenizer.json and the ids the
`tokenizers` library gives for the Unicode test corpus, for tests/test_tokenizer.c.

Offline: trains on Genesis 1-10 from Debian's bible-kjv (`bible -f`) plus corpus.txt.
Needs tokenizers (pinned in requirements-hf.txt); CI only reads the files it writes.

    python3 tests/torch/make_tokenizer_fixtures.py [OUTDIR]
"""
import json
import os
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "fixtures", "tokenizer")

# GPT-2's pre-tokenizer pattern, as Llama 3 and Qwen write theirs: a Split step, then
# ByteLevel without its own regex.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def split_then_byte_level(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def main():
    corpus_path = os.path.join(OUT, "corpus.txt")
    with open(corpus_path, encoding="utf-8", newline="") as f:
        corpus = f.read()
    bible = subprocess.run(["bible", "-f", "Gen1:1-Gen10:32"], check=True,
                           capture_output=True, text=True).stdout

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([bible, corpus] * 3, trainer=trainer)
    tok.save(os.path.join(OUT, "bpe.json"))

    # the same tokenizer with the merges in the older "a b" string form
    with open(os.path.join(OUT, "bpe.json"), encoding="utf-8") as f:
        doc = json.load(f)
    doc["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1]
                              for m in doc["model"]["merges"]]
    with open(os.path.join(OUT, "bpe_string_merges.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)

    # the same vocabulary and merges behind other pre-tokenizers: GPT-2's own layout (a lone
    # ByteLevel with its built-in regex), Llama 3's and Qwen2's patterns (with ignore_merges,
    # as Llama 3 sets it)
    variants = {
        "gpt2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "llama3": split_then_byte_level(LLAMA3_PATTERN),
        "qwen2": split_then_byte_level(QWEN2_PATTERN),
        # SmolLM's layout: every digit alone, then ByteLevel with its regex
        "smollm": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    }
    for name, pre in variants.items():
        v = json.loads(json.dumps(doc))
        v["pre_tokenizer"] = pre
        if name == "llama3":
            v["model"]["ignore_merges"] = True
        with open(os.path.join(OUT, f"bpe_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(v, f, ensure_ascii=False)

    # Llama 3's post-processor: ByteLevel (offsets only), then a template putting
    # <|begin_of_text|> (an added token beyond the trained vocabulary) before the text
    bos = Tokenizer.from_file(os.path.join(OUT, "bpe_llama3.json"))
    bos.add_special_tokens(["<|begin_of_text|>"])
    bos.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos.token_to_id("<|begin_of_text|>"))])])
    bos.save(os.path.join(OUT, "bpe_llama3_bos.json"))

    with_specials = "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>x<|endoftext|><|im_start|> y"
    expected = {
        "corpus": tok.encode(corpus, add_special_tokens=False).ids,
        "with_specials_text": with_specials,
        "with_specials": tok.encode(with_specials, add_special_tokens=False).ids,
    }
    for name in variants:
        vt = Tokenizer.from_file(os.path.join(OUT, f"bpe_{name}.json"))
        expected["corpus_" + name] = vt.encode(corpus, add_special_tokens=False).ids
    bos = Tokenizer.from_file(os.path.join(OUT, "bpe_llama3_bos.json"))
    expected["corpus_llama3_bos"] = bos.encode(corpus).ids
    expected["bos_llama3_bos"] = bos.token_to_id("<|begin_of_text|>")
    assert bos.encode(corpus, add_special_tokens=False).ids == expected["corpus_llama3"]
    assert tok.decode(expected["corpus"], skip_special_tokens=False) == corpus
    with open(os.path.join(OUT, "ids.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
