#!/bin/sh
# trainrun prepare --tokenizer tokenizer.json: the same documents as .txt,
# .jsonl, .jsonl.gz and .jsonl.zst give the same shards; a document's ids
# are the tokenizers library's (tests/fixtures/tokenizer/ids.json) followed by
# the EOS; every shard's tokens decode (with a decoder of python3's own) to
# the documents in order, with the EOS between them, and its header counts
# the bytes they decode to; --workers 1, 2 and 3 write identical bytes; a
# vocabulary over 65536 gives uint32 shards; the EOS comes from --eos, from
# tokenizer_config.json or from the tokenizer's tokens, and is asked for when
# none is found; bad JSONL records are named file:line (or skipped and
# counted); prepare.json records the tokenizer (copied into OUTDIR, with its
# hash); progress: a summary with MB/s, and a bar with an ETA on a terminal;
# re-running into the same OUTDIR works; the tokens plugin trains on the
# shards.
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || skip "python3 checks the shards independently"
FIX="$TR_SRCDIR/tests/fixtures"
TOK="$FIX/tokenizer/bpe.json"
DOCS="$FIX/prepare"

# Shard tools, python3's standard library only (no trainrun code):
#   tokens.py DIR PREFIX          the ids of DIR/PREFIX_*.bin in order, one a line
#   tokens.py --headers DIR PREFIX  "count token_bytes vocab text_bytes" per shard
#   tokens.py --decode TOK DIR PREFIX EOS  the documents the ids decode to, split at EOS,
#                                 each as a JSON string, and checks each shard's text bytes
cat > tokens.py <<'EOF'
import glob, json, struct, sys

def shards(d, prefix):
    out = []
    for path in sorted(glob.glob("%s/%s_*.bin" % (d, prefix))):
        raw = open(path, "rb").read()
        magic, version, width, count, vocab, flags, text = struct.unpack("<8sIIQIIQ", raw[:40])
        assert magic == b"TRTOKENS", path
        assert version == 1 and flags == 0, (path, version, flags)
        assert len(raw) == 64 + width * count, (path, len(raw), width, count)
        ids = struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), raw[64:])
        out.append((ids, width, vocab, text))
    return out

def byte_level(tok):
    j = json.load(open(tok, encoding="utf-8"))
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    text = {i: bytes(byte_of[ch] for ch in t) for t, i in j["model"]["vocab"].items()}
    text.update({a["id"]: a["content"].encode() for a in j.get("added_tokens") or []})
    return text

if sys.argv[1] == "--headers":
    for ids, width, vocab, text in shards(sys.argv[2], sys.argv[3]):
        print(len(ids), width, vocab, text)
elif sys.argv[1] == "--decode":
    text = byte_level(sys.argv[2])
    eos = int(sys.argv[5])
    doc = b""
    for ids, width, vocab, text_bytes in shards(sys.argv[3], sys.argv[4]):
        # the header counts the bytes of text the shard's ids stand for (the EOS: none)
        got = sum(len(text[i]) for i in ids if i != eos)
        assert got == text_bytes, ("text bytes", got, text_bytes)
        for i in ids:
            if i == eos:
                print(json.dumps(doc.decode("utf-8")))
                doc = b""
            else:
                doc += text[i]
    assert doc == b"", "the last document has no EOS"
else:
    for ids, width, vocab, text in shards(sys.argv[1], sys.argv[2]):
        for i in ids:
            print(i)
EOF
# the documents of docs.jsonl in order, without the exact duplicate, as JSON strings
docs_json() {
  python3 -c 'import json, sys
seen = set()
for line in open(sys.argv[1], encoding="utf-8"):
    t = json.loads(line)["text"]
    key = " ".join(t.lower().split())
    if key not in seen:
        seen.add(key)
        print(json.dumps(t))' "$DOCS/docs.jsonl"
}
prep() { "$TRAINRUN" prepare "$@" > out.txt 2> err.txt || { cat out.txt err.txt; fail "prepare $*"; }; }
prep_fails() {
  set +e; "$TRAINRUN" prepare "$@" > out.txt 2> err.txt; rc=$?; set -e
  [ "$rc" != 0 ] || { cat out.txt err.txt; fail "prepare $* succeeded"; }
}
same_shards() {
  for f in $(ls "$1" | grep '\.bin$'); do
    cmp "$1/$f" "$2/$f" || fail "$2/$f differs from $1/$f"
  done
  [ "$(ls "$1" | grep -c '\.bin$')" = "$(ls "$2" | grep -c '\.bin$')" ] || fail "$2 has other shards than $1"
}

# ---- help ---------------------------------------------------------------------
"$TRAINRUN" prepare --help > help.txt
for w in "--tokenizer byte|char|FILE" "--text-field" "--eos" "--workers" "--skip-bad-records" ".jsonl" "zstd"; do
  grep -q -- "$w" help.txt || fail "prepare --help does not mention $w"
done
"$TRAINRUN" help prepare | cmp -s - help.txt || fail "trainrun help prepare is not prepare --help"
"$TRAINRUN" help | grep -q "help \[.*prepare" || fail "trainrun help does not offer help prepare"
grep -q -- "--tokenizer PATH/tokenizer.json" "$TR_SRCDIR/docs/data.md" || fail "docs/data.md does not describe --tokenizer FILE"

# ---- .txt, .jsonl, .jsonl.gz and .jsonl.zst: the same shards ---------------------
cp "$DOCS/docs.txt" "$DOCS/docs.jsonl" "$DOCS/docs.jsonl.zst" .
gzip -c docs.jsonl > docs.jsonl.gz
if command -v zstd > /dev/null; then
  zstd -q -d -c docs.jsonl.zst | cmp -s - docs.jsonl || fail "the fixture's .zst is not docs.jsonl"
fi
common="--tokenizer $TOK --val-fraction 0.2 --shard-tokens 700 --workers 2"
prep docs.txt -o txt $common
grep -q "exact dedup removed 1 document" out.txt || { cat out.txt; fail "the duplicate was not removed"; }
prep docs.jsonl -o jsonl $common
grep -q "30 documents (one per JSONL record)" out.txt || { cat out.txt; fail "jsonl: not one document per record"; }
prep docs.jsonl.gz -o gz $common
prep docs.jsonl.zst -o zst $common
[ -f txt/train_000002.bin ] && [ -f txt/val_000000.bin ] || { ls txt; fail "expected several train shards and a val shard"; }
for d in jsonl gz zst; do same_shards txt $d; done

# every shard decodes to the documents in order, one EOS (<|endoftext|>, id 0) after each
docs_json > want.txt
python3 tokens.py --decode "$TOK" txt train 0 > got.txt || fail "train shards: text bytes or EOS wrong"
python3 tokens.py --decode "$TOK" txt val 0 >> got.txt || fail "val shards: text bytes or EOS wrong"
cmp -s want.txt got.txt || { diff want.txt got.txt | head; fail "the shards do not decode to the documents"; }
grep -q '"tokenizer": {"file": "tokenizer.json", "source": "'"$TOK"'", "hash": "[0-9a-f]\{16\}", "vocab": 1000, "eos": 0}' \
  txt/prepare.json || { cat txt/prepare.json; fail "prepare.json does not record the tokenizer"; }
hash=$(python3 -c 'import sys
h = 0xcbf29ce484222325
for b in open(sys.argv[1], "rb").read():
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print("%016x" % h)' "$TOK")
grep -q "\"hash\": \"$hash\"" txt/prepare.json || fail "prepare.json's hash is not the FNV-1a of the tokenizer ($hash)"
cmp txt/tokenizer.json "$TOK" || fail "OUTDIR/tokenizer.json is not a copy of the tokenizer"
grep -q '"dtype": "uint16"' txt/prepare.json || fail "vocab 1000: not uint16"
# per split: text bytes next to tokens, and the sum of the shard headers
for s in train val; do
  b=$(python3 tokens.py --headers txt $s | awk '{ t += $4 } END { print t }')
  grep -q "\"$s\": {\"documents\": [0-9]*, \"tokens\": [0-9]*, \"bytes\": $b," txt/prepare.json \
    || { cat txt/prepare.json; fail "prepare.json's $s bytes are not $b"; }
done
grep -q '"text_field": "text"' jsonl/prepare.json || fail "prepare.json records no text field"

# ---- a document's ids are the tokenizers library's ---------------------------------
python3 -c 'import json, sys
print(json.dumps({"text": open(sys.argv[1], encoding="utf-8", newline="").read()}))' \
  "$FIX/tokenizer/corpus.txt" > corpus.jsonl
python3 -c 'import json, sys; print("\n".join(map(str, json.load(open(sys.argv[1]))["corpus"])))' \
  "$FIX/tokenizer/ids.json" > want-ids.txt
prep corpus.jsonl -o corpus --tokenizer "$TOK" --val-fraction 0
python3 tokens.py corpus train > got-ids.txt
{ cat want-ids.txt; echo 0; } | cmp -s - got-ids.txt || fail "the corpus's ids (then EOS 0) are not the tokenizers library's"
prep corpus.jsonl -o corpus-noeos --tokenizer "$TOK" --val-fraction 0 --eos none
python3 tokens.py corpus-noeos train | cmp -s want-ids.txt - || fail "--eos none: the ids are not the corpus's alone"
grep -q '"eos": null' corpus-noeos/prepare.json || fail "--eos none: prepare.json's eos is not null"

# SentencePiece style (Llama 2: normalizer, byte fallback, a post-processor adding <s>): the
# ids of encode(text) (add_special_tokens=True, so <s> first), then the EOS </s>; the
# text bytes are the document's, though its tokens decode to other bytes (the prepended ▁)
python3 -c 'import json, sys
text = "".join(open(p, encoding="utf-8", newline="").read() for p in sys.argv[1:])
print(json.dumps({"text": text}))
print(len(text.encode()), file=sys.stderr)' "$FIX/tokenizer/corpus.txt" "$FIX/tokenizer/corpus_norm.txt" \
  > sp.jsonl 2> sp-bytes.txt
prep sp.jsonl -o sp --tokenizer "$FIX/tokenizer/sp_llama2.json" --val-fraction 0
grep -q "EOS </s> (id 2," out.txt || { cat out.txt; fail "sp_llama2: the EOS is not </s>"; }
python3 -c 'import json, sys; print("\n".join(map(str, json.load(open(sys.argv[1]))["special_sp_llama2"] + [2])))' \
  "$FIX/tokenizer/ids.json" > want-sp.txt
python3 tokens.py sp train | cmp -s want-sp.txt - || fail "sp_llama2: the ids are not encode(text) of the tokenizers library, then </s>"
grep -q "\"train\": {\"documents\": 1, \"tokens\": $(wc -l < want-sp.txt), \"bytes\": $(cat sp-bytes.txt)," sp/prepare.json \
  || { cat sp/prepare.json; fail "sp_llama2: the text bytes are not the document's"; }

# ---- workers: identical bytes for 1, 2 and 3 -----------------------------------------
# many documents of different lengths (one per line), several shards
awk 'BEGIN { srand(3); for (i = 0; i < 3000; i++) { n = 1 + int(rand() * 30); s = "doc " i ":"
             for (j = 0; j < n; j++) s = s " " substr("the and of God earth light waters day", 1 + int(rand() * 30), 1 + int(rand() * 6))
             print s } }' > many.txt
prep many.txt -o w1 --tokenizer "$TOK" --doc-separator line --shard-tokens 5000 --workers 1
grep -q "with 1 worker" out.txt || { cat out.txt; fail "--workers 1 not used"; }
for w in 2 3; do
  prep many.txt -o w$w --tokenizer "$TOK" --doc-separator line --shard-tokens 5000 --workers $w
  grep -q "with $w workers" out.txt || { cat out.txt; fail "--workers $w not used"; }
  same_shards w1 w$w
  cmp w1/prepare.json w$w/prepare.json || fail "--workers $w: prepare.json differs"
done
[ -f w1/train_000003.bin ] || fail "expected at least four train shards"

# ---- progress --------------------------------------------------------------------
grep -q "tokenized .* MB/s with 3 workers" out.txt || { cat out.txt; fail "no summary line with MB/s"; }
if grep -q "ETA" err.txt; then fail "a progress bar was drawn on a non-terminal"; fi
if command -v script > /dev/null; then
  script -qec "\"$TRAINRUN\" prepare many.txt -o tty --tokenizer $TOK --doc-separator line" /dev/null > tty.txt 2>&1 \
    || { cat tty.txt; fail "prepare on a terminal"; }
  grep -q "tokenizing 100% \[#*\] .* [kMG]\?B/s  ETA 0:00:00" tty.txt || { cat tty.txt; fail "no progress bar on a terminal"; }
fi

# ---- uint32 tokens for a vocabulary over 65536 ------------------------------------
python3 -c 'import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["added_tokens"].append({"id": 70000, "content": "<|big|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
json.dump(j, open("big.json", "w", encoding="utf-8"))' "$TOK"
awk 'BEGIN { for (i = 0; i < 200; i++) printf "In the beginning %d <|big|> God created\n\n", i }' > big.txt
prep big.txt -o big --tokenizer big.json --val-fraction 0.1
python3 tokens.py --headers big train > heads.txt
read -r count width vocab text < heads.txt
[ "$width" = 4 ] && [ "$vocab" = 70001 ] || { cat heads.txt; fail "vocab 70001: not uint32 shards of vocab 70001"; }
python3 tokens.py big train > got-big.txt
grep -qx 70000 got-big.txt || fail "id 70000 is not in the uint32 shard"
grep -q '"dtype": "uint32"' big/prepare.json || fail "prepare.json: not uint32"
# the tokens plugin trains on uint32 shards
cat > big.lua <<'EOF'
return {
  model = gpt { vocab = 70001, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "tokens", train = "big/train_*.bin", val = "big/val_*.bin" },
  optimizer = { lr = 3e-3 },
  train = { steps = 4, batch = 4, log_every = 2, eval_every = 4 },
}
EOF
"$TRAINRUN" big.lua run_dir=bigrun --quiet 2> train.err || { cat train.err; fail "training on uint32 shards"; }
grep -q '"val_loss"' bigrun/metrics.jsonl || fail "no validation loss from the uint32 shards"

# ---- the EOS: tokenizer_config.json, --eos, none found ---------------------------------
mkdir hf
cp "$TOK" hf/tokenizer.json
echo '{"eos_token": {"content": "<|im_end|>", "special": true}, "model_max_length": 512}' > hf/tokenizer_config.json
prep docs.jsonl -o cfg --tokenizer hf/tokenizer.json --val-fraction 0
grep -q "EOS <|im_end|> (id 2, from tokenizer_config.json)" out.txt || { cat out.txt; fail "the EOS is not tokenizer_config.json's"; }
cmp cfg/tokenizer_config.json hf/tokenizer_config.json || fail "tokenizer_config.json was not copied"
[ "$(python3 tokens.py cfg train | grep -cx 2)" = 29 ] || fail "not one EOS 2 per document"
# a model directory stands for its tokenizer.json
prep docs.jsonl -o cfg-dir --tokenizer hf --val-fraction 0
same_shards cfg cfg-dir
grep -q '"source": "hf/tokenizer.json"' cfg-dir/prepare.json || fail "--tokenizer DIR: not DIR/tokenizer.json"
mkdir notok
prep_fails docs.jsonl -o bad --tokenizer notok
grep -q "notok is a directory without a tokenizer.json" err.txt || { cat err.txt; fail "a directory without tokenizer.json: no reason"; }
prep docs.jsonl -o cfg --tokenizer hf/tokenizer.json --val-fraction 0 --eos "<|im_start|>"
grep -q '"eos": 1[,}]' cfg/prepare.json || { cat cfg/prepare.json; fail "--eos <|im_start|> is not id 1"; }
prep_fails docs.jsonl -o bad --tokenizer "$TOK" --eos "<|nope|>"
grep -q -- "--eos <|nope|>: .*has no such token" err.txt || { cat err.txt; fail "an unknown --eos: no reason"; }
python3 -c 'import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
for a in j["added_tokens"]:
    a["content"] = a["content"].replace("endoftext", "x")
    j["model"]["vocab"] = {(a["content"] if i == a["id"] else t): i for t, i in j["model"]["vocab"].items()}
json.dump(j, open("noeos.json", "w", encoding="utf-8"))' "$TOK"
prep_fails docs.jsonl -o bad --tokenizer noeos.json
grep -q "has none of the end-of-text tokens.*--eos TOKEN" err.txt || { cat err.txt; fail "no EOS found: not asked for --eos"; }
prep_fails docs.jsonl -o bad --tokenizer missing.json
grep -q "cannot read the tokenizer missing.json" err.txt || { cat err.txt; fail "a missing tokenizer: no reason"; }
set +e; "$TRAINRUN" prepare docs.txt -o bad --eos "</s>" > /dev/null 2> err.txt; rc=$?; set -e
[ "$rc" = 2 ] && grep -q "goes with --tokenizer FILE" err.txt || { cat err.txt; fail "--eos with byte tokens: not a usage error"; }

# ---- bad JSONL records: file:line, or skipped and counted --------------------------------
printf '{"text": "first"}\n\n{"text": "second" \n{"id": 3}\n{"text": 4}\n[1, 2]\n{"body": "x", "text": "sixth"}\n' > bad.jsonl
prep_fails bad.jsonl -o bad --tokenizer "$TOK"
grep -q "bad.jsonl:3: not a JSON object (malformed JSON" err.txt || { cat err.txt; fail "malformed JSON: not named file:line"; }
grep -q -- "--skip-bad-records" err.txt || fail "the error does not offer --skip-bad-records"
[ ! -e bad/prepare.json ] || fail "a failed prepare wrote prepare.json"
sed -i 3d bad.jsonl
prep_fails bad.jsonl -o bad --tokenizer "$TOK"
grep -q 'bad.jsonl:3: the record has no field "text" (its fields: "id"); name the text field with --text-field NAME' err.txt \
  || { cat err.txt; fail "a record without the field: no file:line"; }
prep bad.jsonl -o bad --tokenizer "$TOK" --skip-bad-records --val-fraction 0
grep -q 'bad.jsonl:4: field "text" is a number, not a string' err.txt || { cat err.txt; fail "a number field: not warned"; }
grep -q 'bad.jsonl:5: not a JSON object' err.txt || { cat err.txt; fail "an array record: not warned"; }
grep -q "skipped 3 bad records" err.txt || { cat err.txt; fail "the skipped records are not counted"; }
grep -q '"skipped_bad": 3' bad/prepare.json || fail "prepare.json does not count the skipped records"
python3 tokens.py --decode "$TOK" bad train 0 > got.txt
printf '"first"\n"sixth"\n' | cmp -s - got.txt || { cat got.txt; fail "the good records are not the documents"; }
prep bad.jsonl -o body --text-field body --skip-bad-records --val-fraction 0
grep -q "skipped 4 bad records" err.txt || { cat err.txt; fail "--text-field body"; }
# byte tokens read the text field of JSONL, not its syntax
prep bad.jsonl -o bytes --skip-bad-records --val-fraction 0
[ "$(python3 tokens.py bytes train | awk '{ printf "%c", $1 }')" = "$(printf 'first\n\nsixth\n\n')" ] \
  || fail "byte tokens of JSONL are not the text fields with separators"
# text that is not UTF-8: named file:line
printf 'fine\n\nbad \377 byte\n' > latin.txt
prep_fails latin.txt -o bad --tokenizer "$TOK"
grep -q "latin.txt:3: cannot tokenize this document: .*UTF-8" err.txt || { cat err.txt; fail "invalid UTF-8: no file:line"; }

# ---- the output directory: ours to re-run into, the user's refused ------------------------
prep docs.txt -o txt $common
same_shards jsonl txt
prep docs.txt -o txt --val-fraction 0.2
[ ! -e txt/tokenizer.json ] || fail "a byte run left the previous run's tokenizer.json"
grep -q "removed txt/tokenizer.json, left by an earlier run" out.txt || fail "the stale tokenizer.json was not reported"
mkdir mine
echo '{}' > mine/tokenizer.json
prep_fails docs.txt -o mine --tokenizer "$TOK"
grep -q "mine/tokenizer.json exists and was not written by trainrun prepare" err.txt || { cat err.txt; fail "a user's tokenizer.json was not protected"; }
[ "$(cat mine/tokenizer.json)" = '{}' ] || fail "the user's tokenizer.json was changed"
# the tokenizer given is the one already in OUTDIR
prep docs.txt -o jsonl --val-fraction 0.2 --shard-tokens 700 --tokenizer jsonl/tokenizer.json
same_shards zst jsonl

# ---- the tokens plugin trains on the shards ---------------------------------------------
cat > bpe.lua <<'EOF'
return {
  model = gpt { vocab = 1000, ctx = 16, layers = 1, heads = 2, dim = 32 },
  data = { plugin = "tokens", train = "zst/train_*.bin", val = "zst/val_*.bin" },
  optimizer = { lr = 3e-3 },
  train = { steps = 20, batch = 8, log_every = 10, eval_every = 20 },
}
EOF
"$TRAINRUN" bpe.lua run_dir=run --quiet 2> train.err || { cat train.err; fail "training on the prepared shards"; }
grep -q '"val_loss"' run/metrics.jsonl || fail "no validation loss from the val shards"
echo "PASS"
