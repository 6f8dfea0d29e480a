#!/usr/bin/env python3
"""Make tests/fixtures/tokenizer: small tokenizer.json files and the ids the `tokenizers`
library gives for the Unicode test corpora, for tests/test_tokenizer.c:
  bpe*.json    a byte-level BPE (GPT-2 / Llama 3 / Qwen2 / SmolLM layouts, Llama 3's BOS
               template, Qwen2's NFC normalizer, a chain of other normalizers);
  sp_*.json    a BPE on characters with byte fallback, SentencePiece style (Llama 2's
               Prepend + Replace normalizer, Mistral's Metaspace pre-tokenizer, and Metaspace
               with split, the unknown token, NFD, Lowercase, NFKC).

Offline: trains on Genesis 1-10 from Debian's bible-kjv (`bible -f`) plus corpus.txt (and
corpus_norm.txt for the sp_ files).
Needs tokenizers (pinned in requirements-hf.txt); CI only reads the files it writes.

    python3 tests/torch/make_tokenizer_fixtures.py [OUTDIR]
"""
import collections
import json
import os
import random
import subprocess
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

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


# the short texts every sp_ and normalizer fixture is also checked on (ids and decode)
CASES = ["", " ", "  ", "x", " x", "  x", "x ", "x  y", "\n", " \n x", "\t", "▁", "▁x", " ▁x", "a▁▁b",
         "<s>", "<s>x", "x<s>", "x</s>y", " <s> x", "<s> x</s>", "<unk>", "[MASK] x", " [mask]",
         "😀", " 中", "e\u0301", "İ", "ΣΑΣ", "ﬁ①", "\u00a0x\u00a0", "\u3000", "x\u2028",
         "Hello World", "HELLO  WORLD  ", "x <L> y", "x  <R>  y", " [BOTH] ", "\t<L>\n<R>\n", "<R> <L>",
         "a [both]b", "x\u3000<L>"]

LLAMA2_NORMALIZER = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
LLAMA2_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])


def bos_template(tok, bos):
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                         special_tokens=[(bos, tok.token_to_id(bos))])


def save_compact(tok, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(json.loads(tok.to_str()), f, ensure_ascii=False, separators=(",", ":"))


def expect(expected, name, tok, text):
    """ids with and without the post-processor's tokens, and decodes, for one tokenizer"""
    ids = tok.encode(text, add_special_tokens=False).ids
    expected["text_" + name] = ids
    special = tok.encode(text).ids
    if special != ids:  # left out when the post-processor adds nothing
        expected["special_" + name] = special
    expected["decode_" + name] = tok.decode(ids, skip_special_tokens=False)
    expected["cases_" + name] = [[tok.encode(c, add_special_tokens=False).ids,
                                  tok.decode(tok.encode(c, add_special_tokens=False).ids,
                                             skip_special_tokens=False)] for c in CASES]


def normalizer_cases():
    texts = ["", "aaa b", "  Héllo İstanbul ΣΑΣ ﬁ ① Ａ\u00a0 \u3000x\u2028 ", "e\u0301 \u1112\u1161\u11ab 한",
             "\u0085a\u0085", "ǅ ẞ ΐ Ⅻ ㎞", "x\ty\n\nz  ", "\u00c5ngstr\u00f6m", "a▁b"]
    chosen = [
        normalizers.NFC(), normalizers.NFD(), normalizers.NFKC(), normalizers.NFKD(),
        normalizers.Lowercase(), normalizers.Strip(), normalizers.Strip(left=True, right=False),
        normalizers.Strip(left=False, right=True), normalizers.Prepend("▁"),
        normalizers.Replace(" ", "▁"), normalizers.Replace("", "x"), normalizers.Replace("aa", "b"),
        normalizers.Replace(Regex(r"\s+"), "_"), normalizers.Replace(Regex(r"a*"), "X"),
        normalizers.Replace(Regex(r"(?=b)|$"), "|"), normalizers.Replace(Regex(r"\p{M}"), ""),
        normalizers.Sequence([normalizers.NFD(), normalizers.Replace(Regex(r"\p{Mn}"), ""), normalizers.NFC()]),
    ]
    return [[n.__getstate__().decode(), t, n.normalize_str(t)] for n in chosen for t in texts]


def chunk_cases():
    """a tiny Llama 2 style vocabulary whose merges join "▁" to "▁" and "b" to "▁", and long
    texts (one word each: no pre-tokenizer), for the cutting of long words into chunks"""
    doc = {"version": "1.0", "added_tokens": [], "normalizer": json.loads(LLAMA2_NORMALIZER.__getstate__()),
           "pre_tokenizer": None, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "vocab": {"▁": 0, "a": 1, "▁▁": 2, "▁a": 3, "b": 4, "b▁": 5, "<unk>": 6},
                     "merges": [["▁", "▁"], ["▁", "a"], ["b", "▁"]], "unk_token": None,
                     "byte_fallback": False, "fuse_unk": False}}
    rng = random.Random(19)
    texts = ["a  a " * 30, "ab a" * 30, "b  a" * 20 + " x a" * 20, "x a" * 30]
    texts += ["".join(rng.choice("ab  x") for _ in range(200)) for _ in range(8)]
    cases = []
    for unk in (None, "<unk>"):
        doc["model"]["unk_token"] = unk
        tok = Tokenizer.from_str(json.dumps(doc))
        cases.append([json.dumps(doc, ensure_ascii=False), [[t, tok.encode(t).ids] for t in texts]])
    return cases


def sp_fixtures(bible, text, expected):
    """SentencePiece-style BPE: a vocabulary of characters (the rarer ones left out, so they
    fall back to bytes) and <0x00>..<0xFF>, trained on words cut at "▁" as sentencepiece does"""
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    # the 100 most frequent characters, ties to the smaller code point (the trainer's own
    # limit_alphabet breaks ties at random)
    counts = collections.Counter((bible + text).replace(" ", "▁"))
    alphabet = sorted(counts, key=lambda c: (-counts[c], ord(c)))[:100]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=800, min_frequency=2,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  initial_alphabet=alphabet, limit_alphabet=100, show_progress=False)
    tok.train_from_iterator([bible, text] * 3, trainer=trainer)
    base = json.loads(tok.to_str())
    base["added_tokens"] = base["added_tokens"][:3]  # as Llama 2's: the byte tokens are vocabulary only

    def variant(name, normalizer, pre_tokenizer, decoder, post=True, **model):
        v = Tokenizer.from_str(json.dumps(dict(base, model=dict(base["model"], **model))))
        v.normalizer = normalizer
        v.pre_tokenizer = pre_tokenizer
        v.decoder = decoder
        if post:
            v.post_processor = bos_template(v, "<s>")
        path = os.path.join(OUT, f"sp_{name}.json")
        save_compact(v, path)
        v = Tokenizer.from_file(path)
        expect(expected, "sp_" + name, v, text)

    # Llama 2: Prepend + Replace, no pre-tokenizer (each stretch is one word), a template
    # adding <s>
    variant("llama2", LLAMA2_NORMALIZER, None, LLAMA2_DECODER)
    # Mistral as transformers converts it: Metaspace, prepended to the first stretch only,
    # not split
    variant("mistral", None, pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False),
            LLAMA2_DECODER)
    # Metaspace split at each "▁", always prepended, and decoded by Metaspace; NFD; no byte
    # fallback, so characters missing from the vocabulary become <unk>, fused
    variant("split_unk", normalizers.NFD(), pre_tokenizers.Metaspace("▁", prepend_scheme="always", split=True),
            decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="always")]),
            post=False, byte_fallback=False)
    # never prepended, NFKC + Lowercase, unknowns not fused
    variant("never", normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
            pre_tokenizers.Metaspace("▁", prepend_scheme="never", split=True),
            decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="never")]),
            post=False, byte_fallback=False, fuse_unk=False)


def main():
    corpus_path = os.path.join(OUT, "corpus.txt")
    with open(corpus_path, encoding="utf-8", newline="") as f:
        corpus = f.read()
    with open(os.path.join(OUT, "corpus_norm.txt"), encoding="utf-8", newline="") as f:
        text = corpus + f.read()  # what the sp_ and normalizer fixtures are checked on
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
    save_compact(bos, os.path.join(OUT, "bpe_llama3_bos.json"))

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
    # Qwen2's NFC normalizer (the decomposed accents of corpus_norm.txt are composed first)
    qwen = Tokenizer.from_file(os.path.join(OUT, "bpe_qwen2.json"))
    qwen.normalizer = normalizers.NFC()
    save_compact(qwen, os.path.join(OUT, "bpe_qwen2_nfc.json"))
    expect(expected, "bpe_qwen2_nfc", Tokenizer.from_file(os.path.join(OUT, "bpe_qwen2_nfc.json")), text)
    # the other normalizers, in a chain, and added tokens matched before and after it
    norms = Tokenizer.from_file(os.path.join(OUT, "bpe.json"))
    norms.normalizer = normalizers.Sequence([
        normalizers.NFKD(), normalizers.Lowercase(), normalizers.Replace(Regex(r"\s+"), " "),
        normalizers.Replace(Regex(r"[0-9]+"), "#"), normalizers.Strip(left=True, right=True),
        normalizers.Replace("ss", "ß"), normalizers.NFC(), normalizers.Prepend("^")])
    norms.add_tokens([AddedToken("[MASK]", normalized=True), AddedToken("<s>", normalized=False),
                      AddedToken("<L>", lstrip=True, normalized=False),
                      AddedToken("[BOTH]", lstrip=True, rstrip=True, normalized=True)])
    norms.add_special_tokens([AddedToken("<R>", rstrip=True, normalized=False)])
    save_compact(norms, os.path.join(OUT, "bpe_norms.json"))
    expect(expected, "bpe_norms", Tokenizer.from_file(os.path.join(OUT, "bpe_norms.json")), text)

    # layouts shipped files have: byte_fallback beside ByteLevel (the vocabulary has no <0xNN>
    # tokens, so it never fires), decoded by a Sequence with ByteLevel and a Strip after it
    bf = Tokenizer.from_file(os.path.join(OUT, "bpe_llama3_bos.json"))
    bf_doc = json.loads(bf.to_str())
    bf_doc["model"]["byte_fallback"] = True
    bf = Tokenizer.from_str(json.dumps(bf_doc))
    bf.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    save_compact(bf, os.path.join(OUT, "bpe_byte_fallback.json"))
    expect(expected, "bpe_byte_fallback", Tokenizer.from_file(os.path.join(OUT, "bpe_byte_fallback.json")), text)
    # and a vocabulary that has the <0xNN> tokens but not every byte-level character (trained
    # without the full alphabet): a missing character becomes the byte tokens of its UTF-8,
    # which ByteFallback then ByteLevel decode back
    fb = Tokenizer(models.BPE(byte_fallback=True))
    fb.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    fb.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.ByteLevel()])
    fb_trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2,
                                     special_tokens=SPECIALS + ["<0x%02X>" % b for b in range(256)],
                                     show_progress=False)
    fb.train_from_iterator([bible] * 3, trainer=fb_trainer)
    fb_doc = json.loads(fb.to_str())
    fb_doc["added_tokens"] = fb_doc["added_tokens"][:len(SPECIALS)]  # the byte tokens: vocabulary only
    save_compact(Tokenizer.from_str(json.dumps(fb_doc)), os.path.join(OUT, "bpe_byte_tokens.json"))
    fbt = Tokenizer.from_file(os.path.join(OUT, "bpe_byte_tokens.json"))
    expect(expected, "bpe_byte_tokens", fbt, text)
    assert any(fbt.id_to_token(i).startswith("<0x") for i in expected["text_bpe_byte_tokens"])

    # each normalizer alone on short texts: [normalizer, text, what the library makes of it]
    expected["normalizers"] = normalizer_cases()
    expected["cases"] = CASES
    expected["chunks"] = chunk_cases()

    sp_fixtures(bible, text, expected)
    assert tok.decode(expected["corpus"], skip_special_tokens=False) == corpus
    with open(os.path.join(OUT, "ids.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
