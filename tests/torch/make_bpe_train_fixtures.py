#!/usr/bin/env python3
"""Make tests/fixtures/bpe_train: what tests/test_bpe_train.c checks trainrun's BPE trainer
(core/tokenizer/bpe_train.c) against, made offline with the `tokenizers` library.

    python3 tests/torch/make_bpe_train_fixtures.py [TRAINED_JSON]

Writes, in tests/fixtures/bpe_train/:
  train.txt     the training text: Genesis 1-5 from Debian's bible-kjv (`bible -f`), five
                verses a document, and a Unicode corpus; documents are separated by a blank
                line ("\\n\\n"), the test splits them the same way
  encode.txt    text to encode with the trained tokenizer (Genesis 6-7, never trained on, and
                Unicode, digits, contractions, runs of spaces, tabs and newlines)
  library.json  the library's BpeTrainer on those documents with the settings trainrun uses
                (ByteLevel pre-tokenizer without prefix space, the 256 byte symbols as initial
                alphabet, special token <|endoftext|>, vocab_size VOCAB, min_frequency 0):
                the test wants trainrun's vocabulary and merges identical
  ids.json      the ids the library gives encode.txt with TRAINED_JSON, trainrun's own output
                (default: the committed trained.json; after a change to the trainer,
                test_bpe_train writes its new output as tests/test_bpe_train.out.json in the
                build directory: copy it to trained.json and rerun this script)

Needs tokenizers (pinned in requirements-hf.txt); CI only reads the files it writes.
"""
import json
import os
import shutil
import subprocess
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "bpe_train")
VOCAB = 600

UNICODE = """Hello, world! It's a test: we're here, they've gone, I'm sure you'll see, he'd know.
Accents: café naïve résumé façade Ångström Zürich señor São Paulo coöperate œuvre
Русский: Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик 123 ёж.
中文：我能吞下玻璃而不伤身体。日本語：私はガラスを食べられます。
Emoji: 🙂🙃 👍🏽 🇫🇷 ❤️ and 1,000,000 or 3.14159 on 2026-11-25."""

ENCODE_EXTRA = """DON'T SHOUT. Isn't it? You'Re ODD's 'quoted' text.
Numbers: 0 1 12 123 1234 12345 -42 0x1F 7th 1st
Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία; 한국어: 나는 유리를 먹을 수 있어요
Spaces:  two   three    four\tand\ttabs\t\t  mixed \t 
trailing spaces   
\n\n\nthree newlines above; an emoji family 👨‍👩‍👧 and a lone é."""


def verses(ref):
    text = subprocess.run(["bible", "-f", ref], check=True, capture_output=True, text=True).stdout
    lines = [l for l in text.split("\n") if l.strip()]
    # "Ge1:1 In the beginning ...": keep the verse text
    return [l.split(" ", 1)[1] if " " in l else l for l in lines]


def main():
    os.makedirs(OUT, exist_ok=True)
    v = verses("Gen1:1-Gen5:32")
    docs = [" ".join(v[i:i + 5]) for i in range(0, len(v), 5)] + UNICODE.split("\n")
    train = "\n\n".join(docs)
    with open(os.path.join(OUT, "train.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(train)
    encode = "\n".join(verses("Gen6:1-Gen7:24")) + "\n" + ENCODE_EXTRA + "\n"
    with open(os.path.join(OUT, "encode.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(encode)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=0, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train.split("\n\n"), trainer=trainer)
    tok.save(os.path.join(OUT, "library.json"))

    trained = os.path.join(OUT, "trained.json")
    if len(sys.argv) > 1 and os.path.abspath(sys.argv[1]) != os.path.abspath(trained):
        shutil.copyfile(sys.argv[1], trained)
    if not os.path.exists(trained):
        print(f"no {trained} yet: run test_bpe_train, copy the tests/test_bpe_train.out.json it "
              "writes there, and run this again")
        return
    ours = Tokenizer.from_file(trained)
    ids = ours.encode(encode, add_special_tokens=False).ids
    assert ours.decode(ids, skip_special_tokens=False) == encode
    with open(os.path.join(OUT, "ids.json"), "w", encoding="utf-8") as f:
        json.dump({"vocab": VOCAB, "encode.txt": ids}, f)
        f.write("\n")
    print(f"{len(docs)} documents, {len(train)} chars; encode.txt: {len(ids)} ids")


if __name__ == "__main__":
    main()
