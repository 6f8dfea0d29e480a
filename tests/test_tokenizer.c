/* The tokenizer against the `tokenizers` library: the ids and decodes of
 * tests/fixtures/tokenizer/ids.json were made by tests/torch/make_tokenizer_fixtures.py
 * from the bpe*.json and sp_*.json files there, corpus.txt and corpus_norm.txt.
 *
 * Covers: core/tokenizer/ (tokenizer_load.c, tokenizer.c, tokenizer_bpe.c,
 * tokenizer_normalize.c, tokenizer_post.c).
 */
#include <criterion/criterion.h>

#include "util/json.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurp.h"

#define FIX TR_TEST_SRCDIR "/fixtures/tokenizer/"


static struct tr_json *expected(void)
{
    size_t len;
    char *text = tr_test_slurp(FIX "ids.json", &len);
    size_t off;
    struct tr_json *j = tr_json_parse(text, len, &off);
    free(text);
    cr_assert(j, "ids.json does not parse");
    return j;
}

static void check_ids(struct tr_tokenizer *t, const char *text, size_t len, const struct tr_json *want,
                      const char *what)
{
    int32_t *ids;
    size_t n;
    tr_err err = { { 0 } };
    cr_assert_eq(tr_tokenizer_encode(t, text, len, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert(want && want->type == TR_JSON_ARRAY);
    for (size_t i = 0; i < n && i < want->n; i++)
        cr_assert_eq(ids[i], (int32_t)want->items[i]->number, "%s: id %zu is %d, tokenizers says %d",
                     what, i, ids[i], (int)want->items[i]->number);
    cr_assert_eq(n, want->n, "%s: %zu ids, tokenizers gives %zu", what, n, want->n);
    char *back;
    size_t blen;
    cr_assert_eq(tr_tokenizer_decode(t, ids, n, &back, &blen, &err), 0, "%s", err.msg);
    cr_assert_eq(blen, len, "%s: decode(encode(x)) has %zu bytes, not %zu", what, blen, len);
    cr_assert(memcmp(back, text, len) == 0, "%s: decode(encode(x)) != x", what);
    free(back);
    free(ids);
}

static void check_file_key(const char *file, const char *key)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(file, &err);
    cr_assert(t, "%s", err.msg);
    size_t len;
    char *corpus = tr_test_slurp(FIX "corpus.txt", &len);
    struct tr_json *want = expected();
    check_ids(t, corpus, len, tr_json_get(want, key), key);
    /* again: now every word comes from the cache */
    check_ids(t, corpus, len, tr_json_get(want, key), "cached");
    const char *sp = tr_json_string(want, "with_specials_text");
    cr_assert(sp);
    check_ids(t, sp, strlen(sp), tr_json_get(want, "with_specials"), "special tokens");
    tr_json_free(want);
    free(corpus);
    tr_tokenizer_free(t);
}

static void check_file(const char *file) { check_file_key(file, "corpus"); }

Test(tokenizer, ids_equal_tokenizers) { check_file(FIX "bpe.json"); }

Test(tokenizer, merges_as_strings) { check_file(FIX "bpe_string_merges.json"); }

/* the same vocabulary behind GPT-2's lone ByteLevel (its built-in regex), and behind
 * Llama 3's and Qwen2's patterns ((?i:...), \p{N}{1,3}, [\r\n]; Llama 3 with ignore_merges) */
Test(tokenizer, gpt2_byte_level_regex) { check_file_key(FIX "bpe_gpt2.json", "corpus_gpt2"); }
Test(tokenizer, llama3_pattern) { check_file_key(FIX "bpe_llama3.json", "corpus_llama3"); }
Test(tokenizer, qwen2_pattern) { check_file_key(FIX "bpe_qwen2.json", "corpus_qwen2"); }
/* SmolLM's: Digits (each digit alone), then ByteLevel with its regex */
Test(tokenizer, smollm_digits) { check_file_key(FIX "bpe_smollm.json", "corpus_smollm"); }

static void refused(const char *json, const char *want)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_parse(json, strlen(json), "test.json", &err);
    cr_assert_null(t, "accepted: %s", json);
    cr_assert(strstr(err.msg, want), "for %s: message \"%s\" lacks \"%s\"", json, err.msg, want);
}

static void encode_ex_ids(struct tr_tokenizer *t, const char *text, int add_special, const struct tr_json *want,
                          const char *what)
{
    int32_t *ids;
    size_t n;
    tr_err err = { { 0 } };
    cr_assert_eq(tr_tokenizer_encode_ex(t, text, strlen(text), add_special, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert(want && want->type == TR_JSON_ARRAY);
    cr_assert_eq(n, want->n, "%s: %zu ids, tokenizers gives %zu", what, n, want->n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], (int32_t)want->items[i]->number, "%s: id %zu is %d, tokenizers says %d", what, i,
                     ids[i], (int)want->items[i]->number);
    free(ids);
}

/* Llama 3's post-processor: Sequence[ByteLevel, TemplateProcessing "<|begin_of_text|> $A"] */
Test(tokenizer, template_adds_bos)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(FIX "bpe_llama3_bos.json", &err);
    cr_assert(t, "%s", err.msg);
    struct tr_json *want = expected();
    cr_assert_eq(tr_tokenizer_bos_id(t), (int32_t)tr_json_number(want, "bos_llama3_bos", -2));
    cr_assert_eq(tr_tokenizer_eos_id(t), -1);
    size_t len;
    char *corpus = tr_test_slurp(FIX "corpus.txt", &len);
    encode_ex_ids(t, corpus, 1, tr_json_get(want, "corpus_llama3_bos"), "with BOS");
    encode_ex_ids(t, corpus, 0, tr_json_get(want, "corpus_llama3"), "without BOS");
    check_ids(t, corpus, len, tr_json_get(want, "corpus_llama3"), "plain encode adds nothing");
    free(corpus);
    tr_json_free(want);
    tr_tokenizer_free(t);

    /* files without a post-processor add nothing */
    t = tr_tokenizer_load(FIX "bpe.json", &err);
    cr_assert(t, "%s", err.msg);
    cr_assert_eq(tr_tokenizer_bos_id(t), -1);
    cr_assert_eq(tr_tokenizer_eos_id(t), -1);
    int32_t *ids;
    size_t n;
    cr_assert_eq(tr_tokenizer_encode_ex(t, "", 0, 1, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 0);
    free(ids);
    tr_tokenizer_free(t);
}

#define TINY_MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}, " \
                   "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [" \
                   "{\"id\": 3, \"content\": \"<s>\", \"special\": true}, {\"id\": 4, \"content\": \"</s>\", \"special\": true}]"

static void check_post(const char *post, const int32_t *want, size_t nwant, int32_t bos, int32_t eos)
{
    char json[2048];
    snprintf(json, sizeof json, "{" TINY_MODEL ", \"post_processor\": %s}", post);
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_parse(json, strlen(json), "post.json", &err);
    cr_assert(t, "%s: %s", post, err.msg);
    cr_assert_eq(tr_tokenizer_bos_id(t), bos, "%s: BOS %d", post, tr_tokenizer_bos_id(t));
    cr_assert_eq(tr_tokenizer_eos_id(t), eos, "%s: EOS %d", post, tr_tokenizer_eos_id(t));
    int32_t *ids;
    size_t n;
    cr_assert_eq(tr_tokenizer_encode_ex(t, "abb", 3, 1, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, nwant, "%s: %zu ids", post, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "%s: id %zu is %d", post, i, ids[i]);
    free(ids);
    tr_tokenizer_free(t);
}

#define SPECIAL(name, id) "\"" name "\": {\"id\": \"" name "\", \"ids\": [" #id "], \"tokens\": [\"" name "\"]}"
#define PIECE_S(name) "{\"SpecialToken\": {\"id\": \"" name "\", \"type_id\": 0}}"
#define PIECE_A "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}"

/* "abb" is [ab, b]; the post-processors put their tokens around it (what the tokenizers
 * library does with these files: BOS first, EOS last) */
Test(tokenizer, post_processors)
{
    check_post("{\"type\": \"TemplateProcessing\", \"single\": [" PIECE_A ", " PIECE_S("</s>") "], "
               "\"pair\": [], \"special_tokens\": {" SPECIAL("</s>", 4) "}}",
               (int32_t[]){ 2, 1, 4 }, 3, -1, 4);
    check_post("{\"type\": \"TemplateProcessing\", \"single\": [" PIECE_S("<s>") ", " PIECE_A ", " PIECE_S("</s>") "], "
               "\"special_tokens\": {" SPECIAL("<s>", 3) ", " SPECIAL("</s>", 4) "}}",
               (int32_t[]){ 3, 2, 1, 4 }, 4, 3, 4);
    check_post("{\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 4], \"cls\": [\"<s>\", 3], "
               "\"trim_offsets\": true, \"add_prefix_space\": false}",
               (int32_t[]){ 3, 2, 1, 4 }, 4, 3, 4);
    check_post("{\"type\": \"BertProcessing\", \"sep\": [\"</s>\", 4], \"cls\": [\"<s>\", 3]}",
               (int32_t[]){ 3, 2, 1, 4 }, 4, 3, 4);
    check_post("{\"type\": \"ByteLevel\", \"trim_offsets\": true}", (int32_t[]){ 2, 1 }, 2, -1, -1);
    check_post("null", (int32_t[]){ 2, 1 }, 2, -1, -1);

    refused("{" TINY_MODEL ", \"post_processor\": {\"type\": \"Whatever\"}}",
            "not supported yet: post-processor Whatever in test.json");
    refused("{" TINY_MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
            PIECE_A ", {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\": {}}}",
            "not supported yet: a single template with sequence B");
    refused("{" TINY_MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
            PIECE_S("<x>") ", " PIECE_A "], \"special_tokens\": {}}}",
            "names special token <x>");
    refused("{" TINY_MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
            PIECE_S("<s>") ", " PIECE_A "], \"special_tokens\": {" SPECIAL("<s>", 99) "}}}",
            "outside the vocabulary");
    refused("{" TINY_MODEL ", \"post_processor\": {\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 40], "
            "\"cls\": [\"<s>\", 3]}}",
            "RobertaProcessing needs \"sep\"");
}

/* corpus.txt + corpus_norm.txt: what the sp_ and normalizer fixtures were checked on */
static char *text_all(size_t *len)
{
    size_t a, b;
    char *x = tr_test_slurp(FIX "corpus.txt", &a), *y = tr_test_slurp(FIX "corpus_norm.txt", &b);
    x = realloc(x, a + b + 1);
    memcpy(x + a, y, b + 1);
    free(y);
    *len = a + b;
    return x;
}

static void same_ids(const int32_t *ids, size_t n, const struct tr_json *want, const char *what, size_t k)
{
    cr_assert(want && want->type == TR_JSON_ARRAY, "%s: no expected ids", what);
    for (size_t i = 0; i < n && i < want->n; i++)
        cr_assert_eq(ids[i], (int32_t)want->items[i]->number, "%s [%zu]: id %zu is %d, tokenizers says %d", what,
                     k, i, ids[i], (int)want->items[i]->number);
    cr_assert_eq(n, want->n, "%s [%zu]: %zu ids, tokenizers gives %zu", what, k, n, want->n);
}

static void same_decode(struct tr_tokenizer *t, const int32_t *ids, size_t n, const char *want, const char *what,
                        size_t k)
{
    char *back;
    size_t blen;
    tr_err err = { { 0 } };
    cr_assert(want, "%s: no expected decode", what);
    cr_assert_eq(tr_tokenizer_decode(t, ids, n, &back, &blen, &err), 0, "%s", err.msg);
    cr_assert(blen == strlen(want) && memcmp(back, want, blen) == 0,
              "%s [%zu]: decode gives \"%s\", tokenizers \"%s\"", what, k, back, want);
    free(back);
}

/* One fixture of make_tokenizer_fixtures.py's expect(): the ids of the whole text with and
 * without the post-processor's tokens, its decode, and the ids and decode of each short case. */
static void check_fixture(const char *file, const char *name)
{
    char key[128];
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(file, &err);
    cr_assert(t, "%s", err.msg);
    struct tr_json *want = expected();
    size_t len;
    char *text = text_all(&len);
    for (int round = 0; round < 2; round++) { /* the second from the word cache */
        int32_t *ids;
        size_t n;
        cr_assert_eq(tr_tokenizer_encode(t, text, len, &ids, &n, &err), 0, "%s", err.msg);
        snprintf(key, sizeof key, "text_%s", name);
        same_ids(ids, n, tr_json_get(want, key), key, 0);
        snprintf(key, sizeof key, "decode_%s", name);
        same_decode(t, ids, n, tr_json_string(want, key), key, 0);
        free(ids);
        cr_assert_eq(tr_tokenizer_encode_ex(t, text, len, 1, &ids, &n, &err), 0, "%s", err.msg);
        snprintf(key, sizeof key, "special_%s", name);
        if (!tr_json_get(want, key))
            snprintf(key, sizeof key, "text_%s", name);
        same_ids(ids, n, tr_json_get(want, key), key, 0);
        free(ids);
    }
    const struct tr_json *cases = tr_json_get(want, "cases");
    snprintf(key, sizeof key, "cases_%s", name);
    const struct tr_json *got = tr_json_get(want, key);
    cr_assert(cases && got && cases->n == got->n);
    for (size_t i = 0; i < cases->n; i++) {
        const char *c = cases->items[i]->string;
        int32_t *ids;
        size_t n;
        cr_assert_eq(tr_tokenizer_encode(t, c, strlen(c), &ids, &n, &err), 0, "%s", err.msg);
        same_ids(ids, n, got->items[i]->items[0], key, i);
        same_decode(t, ids, n, got->items[i]->items[1]->string, key, i);
        free(ids);
    }
    free(text);
    tr_json_free(want);
    tr_tokenizer_free(t);
}

/* Streaming: the pieces decode_next gives, one id at a time, add up to decode of them all
 * (the Llama 2 layout strips the first space, byte tokens come as bytes until complete). */
static void check_stream(const char *file)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(file, &err);
    cr_assert(t, "%s", err.msg);
    size_t len;
    char *text = text_all(&len);
    int32_t *ids;
    size_t n;
    cr_assert_eq(tr_tokenizer_encode_ex(t, text, len, 1, &ids, &n, &err), 0, "%s", err.msg);
    char *whole;
    size_t nwhole;
    cr_assert_eq(tr_tokenizer_decode(t, ids, n, &whole, &nwhole, &err), 0, "%s", err.msg);
    char *joined = calloc(nwhole + 1, 1);
    size_t at = 0;
    for (size_t i = 1; i <= n; i++) {
        char *piece;
        size_t np;
        cr_assert_eq(tr_tokenizer_decode_next(t, ids, i, &piece, &np, &err), 0, "%s", err.msg);
        cr_assert_leq(at + np, nwhole, "%s: the pieces run past the decode at id %zu", file, i);
        memcpy(joined + at, piece, np);
        at += np;
        free(piece);
    }
    cr_assert(at == nwhole && memcmp(joined, whole, nwhole) == 0, "%s: the pieces are not the decode", file);
    free(joined);
    free(whole);
    free(ids);
    free(text);
    tr_tokenizer_free(t);
}

Test(tokenizer, decode_next_streams)
{
    check_stream(FIX "sp_llama2.json");
    check_stream(FIX "sp_split_unk.json");
    check_stream(FIX "bpe_llama3_bos.json");
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(FIX "sp_llama2.json", &err);
    cr_assert(t, "%s", err.msg);
    /* "中" is not in the vocabulary: three byte tokens, given as bytes one by one */
    int32_t *ids;
    size_t n;
    cr_assert_eq(tr_tokenizer_encode(t, "\xe4\xb8\xad", 3, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 4); /* "▁" and the three bytes */
    for (size_t i = 2; i <= 4; i++) {
        char *piece;
        size_t np;
        cr_assert_eq(tr_tokenizer_decode_next(t, ids, i, &piece, &np, &err), 0, "%s", err.msg);
        cr_assert(np == 1 && (unsigned char)piece[0] == (unsigned char)"\xe4\xb8\xad"[i - 2]);
        free(piece);
    }
    free(ids);
    tr_tokenizer_free(t);
}

/* Qwen2's layout: NFC first (corpus_norm.txt has decomposed accents and Hangul jamo) */
Test(tokenizer, qwen2_nfc) { check_fixture(FIX "bpe_qwen2_nfc.json", "bpe_qwen2_nfc"); }
/* NFKD, Lowercase, Replace (regex and string), Strip, NFC, Prepend in one chain, with an
 * added token matched in the normalized text ([MASK] -> [mask]) and one matched before */
Test(tokenizer, normalizer_chain) { check_fixture(FIX "bpe_norms.json", "bpe_norms"); }
/* shipped layouts: byte_fallback beside ByteLevel with no <0xNN> tokens, decoded by
 * Sequence([ByteLevel, Strip]); and with <0xNN> tokens and characters missing from the
 * vocabulary, decoded by Sequence([ByteFallback, ByteLevel]) */
Test(tokenizer, byte_fallback_with_byte_level)
{
    check_fixture(FIX "bpe_byte_fallback.json", "bpe_byte_fallback");
    check_stream(FIX "bpe_byte_fallback.json");
}
Test(tokenizer, byte_tokens_with_byte_level)
{
    check_fixture(FIX "bpe_byte_tokens.json", "bpe_byte_tokens");
    check_stream(FIX "bpe_byte_tokens.json");
}

/* SentencePiece style: characters, <0xNN> byte fallback, "▁" for spaces */
Test(tokenizer, sp_llama2) { check_fixture(FIX "sp_llama2.json", "sp_llama2"); }
Test(tokenizer, sp_mistral_metaspace_first) { check_fixture(FIX "sp_mistral.json", "sp_mistral"); }
Test(tokenizer, sp_metaspace_split_unk) { check_fixture(FIX "sp_split_unk.json", "sp_split_unk"); }
Test(tokenizer, sp_metaspace_never) { check_fixture(FIX "sp_never.json", "sp_never"); }

Test(tokenizer, sp_special_ids)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(FIX "sp_llama2.json", &err);
    cr_assert(t, "%s", err.msg);
    cr_assert_eq(tr_tokenizer_bos_id(t), 1);
    cr_assert_eq(tr_tokenizer_eos_id(t), -1); /* Llama 2's template adds no EOS */
    cr_assert_eq(tr_tokenizer_token_id(t, "</s>"), 2);
    cr_assert_eq(tr_tokenizer_vocab_size(t), 800);
    tr_tokenizer_free(t);
}

/* Long words on characters are merged in chunks cut before a "▁": against the library on
 * long texts whose vocabulary joins "▁" to "▁" and "b" to "▁" (no cut there), with
 * characters missing from it dropped or unknown (no cut after them either). */
Test(tokenizer, long_words_in_chunks)
{
    struct tr_json *want = expected();
    const struct tr_json *sets = tr_json_get(want, "chunks");
    cr_assert(sets && sets->n == 2);
    for (size_t k = 0; k < sets->n; k++) {
        const char *json = sets->items[k]->items[0]->string;
        const struct tr_json *cases = sets->items[k]->items[1];
        tr_err err = { { 0 } };
        struct tr_tokenizer *t = tr_tokenizer_parse(json, strlen(json), "chunks.json", &err);
        cr_assert(t, "%s", err.msg);
        for (size_t i = 0; i < cases->n; i++) {
            const char *text = cases->items[i]->items[0]->string;
            int32_t *ids;
            size_t n;
            cr_assert_gt(strlen(text), 64); /* longer than a cached word */
            cr_assert_eq(tr_tokenizer_encode(t, text, strlen(text), &ids, &n, &err), 0, "%s", err.msg);
            same_ids(ids, n, cases->items[i]->items[1], "chunks", k * 100 + i);
            free(ids);
        }
        tr_tokenizer_free(t);
    }
    tr_json_free(want);
}

static void collect(void *ctx, const char *w, size_t n)
{
    char *out = ctx;
    size_t have = strlen(out);
    cr_assert(have + n < 4096);
    memcpy(out + have, w, n);
    out[have + n] = 0;
}

/* Each normalizer alone against the library's normalize_str, through a tokenizer whose
 * pre-tokenizer keeps each stretch whole (the words handed out are the normalized text). */
Test(tokenizer, normalizers_alone)
{
    struct tr_json *want = expected();
    const struct tr_json *list = tr_json_get(want, "normalizers");
    cr_assert(list && list->n > 50);
    for (size_t i = 0; i < list->n; i++) {
        const struct tr_json *c = list->items[i];
        const char *norm = c->items[0]->string, *in = c->items[1]->string, *out = c->items[2]->string;
        char json[1024];
        snprintf(json, sizeof json, "{\"normalizer\": %s, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                 "\"use_regex\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                 norm);
        tr_err err = { { 0 } };
        struct tr_tokenizer *t = tr_tokenizer_parse(json, strlen(json), "norm.json", &err);
        cr_assert(t, "%s: %s", norm, err.msg);
        char got[4096] = "";
        cr_assert_eq(tr_tokenizer_pretokenize(t, in, strlen(in), collect, got, &err), 0, "%s", err.msg);
        cr_assert_str_eq(got, out, "%s on \"%s\": \"%s\", tokenizers gives \"%s\"", norm, in, got, out);
        tr_tokenizer_free(t);
    }
    tr_json_free(want);
}

/* random valid UTF-8: ASCII (spaces, tabs, newlines, digits, quotes), 2-, 3- and 4-byte chars */
static size_t put_char(char *s, uint64_t *rng)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(*rng >> 33);
    static const char ascii[] = "  \t\n\r'sdltmve0123456789aZ.,!?-_";
    unsigned cp;
    switch (r % 6) {
    case 0: case 1: s[0] = ascii[(r >> 3) % (sizeof ascii - 1)]; return 1;
    case 2: cp = 0x20 + (r >> 3) % 0x5F; s[0] = (char)cp; return 1;
    case 3: cp = 0x80 + (r >> 3) % (0x800 - 0x80); break;
    case 4: cp = 0x800 + (r >> 3) % (0x10000 - 0x800); if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E00; break;
    default: cp = 0x10000 + (r >> 3) % (0x110000 - 0x10000); break;
    }
    if (cp < 0x800) { s[0] = (char)(0xC0 | cp >> 6); s[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        s[0] = (char)(0xE0 | cp >> 12); s[1] = (char)(0x80 | (cp >> 6 & 0x3F)); s[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    s[0] = (char)(0xF0 | cp >> 18); s[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    s[2] = (char)(0x80 | (cp >> 6 & 0x3F)); s[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Llama 2's layout: "▁" is prepended and the decoder strips one leading space again, and
 * characters outside the vocabulary come back through their <0xNN> tokens */
Test(tokenizer, round_trip_random_utf8_sp)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(FIX "sp_llama2.json", &err);
    cr_assert(t, "%s", err.msg);
    uint64_t rng = 777;
    char buf[4 * 300 + 1];
    for (int round = 0; round < 300; round++) {
        size_t len = 0, nch = (size_t)round;
        for (size_t i = 0; i < nch; i++) {
            size_t k = put_char(buf + len, &rng);
            if (!(k == 3 && memcmp(buf + len, "\xe2\x96\x81", 3) == 0) && !(k == 1 && buf[len] == '<'))
                len += k; /* no "▁" (it decodes to a space) and no special tokens */
        }
        int32_t *ids;
        size_t n;
        cr_assert_eq(tr_tokenizer_encode(t, buf, len, &ids, &n, &err), 0, "%s", err.msg);
        char *back;
        size_t blen;
        cr_assert_eq(tr_tokenizer_decode(t, ids, n, &back, &blen, &err), 0, "%s", err.msg);
        cr_assert(blen == len && memcmp(back, buf, len) == 0, "round %d: decode(encode(x)) != x", round);
        free(back);
        free(ids);
    }
    tr_tokenizer_free(t);
}

Test(tokenizer, round_trip_random_utf8)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(FIX "bpe.json", &err);
    cr_assert(t, "%s", err.msg);
    uint64_t rng = 12345;
    char buf[4 * 400 + 1];
    for (int round = 0; round < 500; round++) {
        size_t len = 0, nch = (size_t)(round % 400);
        for (size_t i = 0; i < nch; i++)
            len += put_char(buf + len, &rng);
        int32_t *ids;
        size_t n;
        cr_assert_eq(tr_tokenizer_encode(t, buf, len, &ids, &n, &err), 0, "%s", err.msg);
        for (size_t i = 0; i < n; i++)
            cr_assert(ids[i] >= 0 && (size_t)ids[i] < tr_tokenizer_vocab_size(t));
        char *back;
        size_t blen;
        cr_assert_eq(tr_tokenizer_decode(t, ids, n, &back, &blen, &err), 0, "%s", err.msg);
        cr_assert(blen == len && memcmp(back, buf, len) == 0, "round %d: decode(encode(x)) != x", round);
        free(back);
        free(ids);
    }
    /* invalid UTF-8 is refused, not mangled */
    int32_t *ids;
    size_t n;
    cr_assert_neq(tr_tokenizer_encode(t, "ab\xff", 3, &ids, &n, &err), 0);
    cr_assert(strstr(err.msg, "UTF-8"), "%s", err.msg);
    int32_t bad = (int32_t)tr_tokenizer_vocab_size(t);
    char *back;
    size_t blen;
    cr_assert_neq(tr_tokenizer_decode(t, &bad, 1, &back, &blen, &err), 0);
    tr_tokenizer_free(t);
}


Test(tokenizer, unsupported_models)
{
    refused("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
            "not supported yet: model type WordPiece in test.json");
    refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "not supported yet: model type Unigram");
    refused("{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\"}, \"model\": {\"type\": "
            "\"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": true}, \"decoder\": "
            "{\"type\": \"WordPiece\"}}",
            "not supported yet: decoder WordPiece in test.json");
    /* a ByteLevel decoder needs ByteLevel pre-tokenization; a byte-level file's decoder chain
     * must turn characters back into bytes (ByteLevel somewhere in it) */
    refused("{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\"}, \"model\": {\"type\": "
            "\"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"decoder\": {\"type\": \"ByteLevel\"}}",
            "not supported yet: decoder ByteLevel without a ByteLevel pre-tokenizer in test.json");
    refused("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
            "{\"a\": 0}, \"merges\": []}, \"decoder\": {\"type\": \"Sequence\", \"decoders\": "
            "[{\"type\": \"Fuse\"}]}}",
            "not supported yet: decoder Sequence without ByteLevel, with a ByteLevel pre-tokenizer in test.json");
    refused("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
            "\"merges\": []}}",
            "not supported yet: pre-tokenizer Whitespace in test.json");
    refused("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, "
            "{\"type\": \"Metaspace\", \"replacement\": \"_\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": "
            "{\"a\": 0}, \"merges\": []}}",
            "not supported yet: pre-tokenizer Digits in a Sequence in test.json");
    refused("{\"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}, \"model\": {\"type\": "
            "\"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
            "not supported yet: normalizer Precompiled in test.json");
    refused("{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": "
            "\"BertNormalizer\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
            "not supported yet: normalizer BertNormalizer in test.json");
    refused("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"Metaspace\", "
            "\"replacement\": \"_\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
            "not supported yet: decoder Metaspace without ByteLevel, with a ByteLevel pre-tokenizer in test.json");
}

/* A real file cut short or with random bytes changed (within its first `head` bytes when
 * head > 0): refused with a message, or loaded and then usable, never a crash. */
static void fuzz_file(const char *path, size_t head)
{
    size_t len;
    char *text = tr_test_slurp(path, &len);
    for (size_t cut = 0; !head && cut < len; cut += 97) {
        tr_err err = { { 0 } };
        struct tr_tokenizer *t = tr_tokenizer_parse(text, cut, "cut.json", &err);
        cr_assert_null(t, "a file cut at %zu loads", cut);
    }
    uint64_t rng = 99;
    size_t span = head && head < len ? head : len;
    for (int round = 0; round < 300; round++) {
        char *copy = malloc(len);
        memcpy(copy, text, len);
        for (int k = 0; k < 1 + round % 4; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(rng >> 20) % span;
            static const char pick[] = "\"\\{}[]:, 0123456789abu\xc3\xa9\xff";
            copy[at] = pick[(rng >> 8) % (sizeof pick - 1)];
        }
        tr_err err = { { 0 } };
        struct tr_tokenizer *t = tr_tokenizer_parse(copy, len, "flipped.json", &err);
        if (t) {
            static const char sample[] = "Hello, world! 123 caf\xc3\xa9 <s> \xe2\x96\x81x \xf0\x9f\x98\x80  ";
            int32_t *ids;
            size_t n;
            for (int special = 0; special < 2; special++)
                if (tr_tokenizer_encode_ex(t, sample, sizeof sample - 1, special, &ids, &n, &err) == 0) {
                    char *back;
                    size_t blen;
                    if (tr_tokenizer_decode(t, ids, n, &back, &blen, &err) == 0)
                        free(back);
                    free(ids);
                }
            tr_tokenizer_free(t);
        } else {
            cr_assert(err.msg[0], "no message for a damaged file");
        }
        free(copy);
    }
    free(text);
}

/* Replace steps that lengthen the text on every pass: three of them make "a" a thousand
 * "a"s (ten of them would make a 4-character prompt 40 GB); the normalizers and the decoders
 * may make a text at most 32 times longer (plus 4 KiB), an error naming the file. */
static const char grow10[] = "{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"aaaaaaaaaa\"}";

static struct tr_tokenizer *growing(const char *where)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"%s\": {\"type\": \"Sequence\", \"%s\": [%s, %s, %s]}, "
             "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}",
             where, strcmp(where, "normalizer") == 0 ? "normalizers" : "decoders", grow10, grow10, grow10);
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_parse(json, strlen(json), "grow.json", &err);
    cr_assert_not_null(t, "%s", err.msg);
    return t;
}

Test(tokenizer, normalizers_and_decoders_cannot_grow_text_without_bound)
{
    struct tr_tokenizer *t = growing("normalizer");
    char text[64];
    memset(text, 'a', sizeof text);
    int32_t *ids = NULL;
    size_t n = 0;
    tr_err err = { { 0 } };
    cr_assert_neq(tr_tokenizer_encode(t, text, sizeof text, &ids, &n, &err), TR_OK,
                  "64 bytes normalized to 64000 were encoded");
    cr_assert(strstr(err.msg, "grow.json: its normalizers make a text of 64 bytes longer than 6144 bytes"), "%s",
              err.msg);
    free(ids);
    /* a text of bytes that no Replace matches goes through as it is */
    memset(text, 'b', sizeof text);
    cr_assert_eq(tr_tokenizer_encode(t, text, sizeof text, &ids, &n, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(n, sizeof text);
    free(ids);
    tr_tokenizer_free(t);

    t = growing("decoder");
    int32_t a[8] = { 0, 0, 0, 0, 0, 0, 0, 1 };
    char *out = NULL;
    size_t len = 0;
    cr_assert_neq(tr_tokenizer_decode(t, a, 8, &out, &len, &err), TR_OK, "8 bytes decoded to 7001");
    cr_assert(strstr(err.msg, "grow.json: its decoders make a text of 8 bytes longer than 4352 bytes"), "%s",
              err.msg);
    free(out);
    /* a short text within the bound decodes */
    cr_assert_eq(tr_tokenizer_decode(t, a + 6, 2, &out, &len, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(len, 1001);
    free(out);
    tr_tokenizer_free(t);
}

Test(tokenizer, damaged_files_refused)
{
    static const char *const bad[] = {
        "",
        "[]",
        "{",
        "{\"model\": 3}",
        "{\"model\": {\"type\": \"BPE\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1e12}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a\"]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\"]]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [3]}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}",
        "{\"added_tokens\": [{\"id\": 5}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"added_tokens\": [{\"id\": -5, \"content\": \"x\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"added_tokens\": 7, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, "
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, \"content\": \"x\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": \"x\", \"content\": \"x\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"normalizer\": {\"type\": \"Prepend\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"normalizer\": {\"type\": \"Sequence\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"normalizer\": [], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Sequence\", \"decoders\": []}]}]}]}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"normalized\": 3}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tr_err err = { { 0 } };
        struct tr_tokenizer *t = tr_tokenizer_parse(bad[i], strlen(bad[i]), "bad.json", &err);
        cr_assert_null(t, "accepted: %s", bad[i]);
        cr_assert(err.msg[0], "no message for %s", bad[i]);
    }
    fuzz_file(FIX "bpe_string_merges.json", 0);
    /* the SentencePiece-style file: flips also kept to its head, where the normalizer,
     * post-processor and decoder are */
    fuzz_file(FIX "sp_llama2.json", 0);
    fuzz_file(FIX "sp_llama2.json", 1500);
    tr_err err = { { 0 } };
    cr_assert_null(tr_tokenizer_load(FIX "no-such-file.json", &err));
    cr_assert(strstr(err.msg, "no-such-file.json"));
}

/* tr_tokenizer_unknown_at (sample's prompt check): only a character with no token counts,
 * at its byte offset; normalizers and decoders that do not give the text back do not. */
static size_t unknown_at(const char *file, const char *text)
{
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_load(file, &err);
    cr_assert(t, "%s", err.msg);
    size_t at = 0, again = 0;
    cr_assert_eq(tr_tokenizer_unknown_at(t, text, strlen(text), &at, &err), 0, "%s", err.msg);
    /* a second time: words with unknowns are not answered from the cache uncounted */
    cr_assert_eq(tr_tokenizer_unknown_at(t, text, strlen(text), &again, &err), 0, "%s", err.msg);
    cr_assert_eq(at, again, "%s: '%s' at %zu, then at %zu", file, text, at, again);
    tr_tokenizer_free(t);
    return at;
}

Test(tokenizer, unknown_at)
{
    /* no byte fallback, no K in the vocabulary: <unk> */
    cr_assert_eq(unknown_at(FIX "sp_split_unk.json", "the King"), 4);
    cr_assert_eq(unknown_at(FIX "sp_split_unk.json", "the caf\xc3\xa9 King"), 10);
    cr_assert_eq(unknown_at(FIX "sp_split_unk.json", "KQ"), 0);
    cr_assert_eq(unknown_at(FIX "sp_split_unk.json", "the king"), 8);
    /* lowercased by the normalizer before the vocabulary is asked */
    cr_assert_eq(unknown_at(FIX "sp_never.json", "the King"), 8);
    /* NFC composes e + U+0301; byte fallback covers any character; Mistral's decode drops
     * the leading space */
    cr_assert_eq(unknown_at(FIX "bpe_qwen2_nfc.json", "cafe\xcc\x81"), 6);
    cr_assert_eq(unknown_at(FIX "sp_llama2.json", "K\xe2\x82\xac <s>Hi"), 10);
    cr_assert_eq(unknown_at(FIX "sp_mistral.json", " two  spaces"), 12);

    /* a byte-level alphabet with holes (only a and b), no unknown token: c is dropped */
    static const char json[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false},"
        " \"decoder\": {\"type\": \"ByteLevel\"}}";
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_parse(json, strlen(json), "holes.json", &err);
    cr_assert(t, "%s", err.msg);
    size_t at = 0;
    cr_assert_eq(tr_tokenizer_unknown_at(t, "abab", 4, &at, &err), 0, "%s", err.msg);
    cr_assert_eq(at, 4);
    cr_assert_eq(tr_tokenizer_unknown_at(t, "ab\xc3\xa9" "a", 5, &at, &err), 0, "%s", err.msg);
    cr_assert_eq(at, 2);
    tr_tokenizer_free(t);
}
