/* The BPE trainer (core/tokenizer/bpe_train.c) against the `tokenizers` library's BpeTrainer:
 * tests/fixtures/bpe_train/ was made by tests/torch/make_bpe_train_fixtures.py.
 *   library.json  the library's training on train.txt: our vocabulary and merges must equal it
 *   trained.json  our own output (checked to be what the trainer writes now)
 *   ids.json      the library's ids for encode.txt with trained.json: tokenizer.c loading
 *                 our file must give the same ids, and decode them back to the text
 *
 * Covers: core/tokenizer/bpe_train.c, and the room's loading (tokenizer_load.c) and
 * encode of what it writes.
 */
#include <criterion/criterion.h>

#include "tokenizer/bpe_train.h"
#include "util/json.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurp.h"

#define FIX TR_TEST_SRCDIR "/fixtures/bpe_train/"
#define VOCAB 600 /* make_bpe_train_fixtures.py's */

static const char *const EOS[] = {TR_BPE_EOS};


static struct tr_json *parse(const char *text, size_t len, const char *what)
{
    size_t off = 0;
    struct tr_json *j = tr_json_parse(text, len, &off);
    cr_assert(j, "%s is not JSON (at byte %zu)", what, off);
    return j;
}

/* Train on the fixture's documents (blank-line separated, as the generator splits them). */
static char *train_fixture(size_t vocab, size_t *len, struct tr_bpe_stats *st)
{
    size_t n;
    char *text = tr_test_slurp(FIX "train.txt", &n);
    tr_err err = { { 0 } };
    struct tr_bpe_trainer *b = tr_bpe_trainer_new(&err);
    cr_assert(b, "%s", err.msg);
    for (char *doc = text;;) {
        char *sep = strstr(doc, "\n\n");
        size_t dlen = sep ? (size_t)(sep - doc) : strlen(doc);
        cr_assert_eq(tr_bpe_trainer_feed(b, doc, dlen, &err), 0, "%s", err.msg);
        if (!sep)
            break;
        doc = sep + 2;
    }
    char *json;
    cr_assert_eq(tr_bpe_trainer_train(b, vocab, 0, EOS, 1, &json, len, st, &err), 0, "%s", err.msg);
    tr_bpe_trainer_free(b);
    free(text);
    return json;
}

static void same_strings(const struct tr_json *x, const struct tr_json *y, const char *what, size_t i)
{
    cr_assert(x->type == TR_JSON_STRING && y->type == TR_JSON_STRING, "%s %zu: not strings", what, i);
    cr_assert_str_eq(x->string, y->string, "%s %zu: \"%s\", the library has \"%s\"", what, i, x->string,
                     y->string);
}

Test(bpe_train, merges_equal_the_library)
{
    size_t len, llen;
    struct tr_bpe_stats st;
    char *ours = train_fixture(VOCAB, &len, &st);
    char *lib = tr_test_slurp(FIX "library.json", &llen);
    struct tr_json *a = parse(ours, len, "our tokenizer.json"), *b = parse(lib, llen, "library.json");
    const struct tr_json *ma = tr_json_get(a, "model"), *mb = tr_json_get(b, "model");
    const struct tr_json *va = tr_json_get(ma, "vocab"), *vb = tr_json_get(mb, "vocab");
    cr_assert_eq(va->n, (size_t)VOCAB, "our vocabulary has %zu entries, not %d", va->n, VOCAB);
    cr_assert_eq(va->n, vb->n);
    cr_assert_eq(st.vocab, (size_t)VOCAB);
    for (size_t i = 0; i < vb->n; i++) {
        const struct tr_json *id = tr_json_get(va, vb->keys[i]);
        cr_assert(id, "the library's token \"%s\" is not in ours", vb->keys[i]);
        cr_assert_eq(id->number, vb->items[i]->number, "token \"%s\": id %g, the library's %g",
                     vb->keys[i], id->number, vb->items[i]->number);
    }
    const struct tr_json *ga = tr_json_get(ma, "merges"), *gb = tr_json_get(mb, "merges");
    cr_assert_eq(ga->n, gb->n, "%zu merges, the library makes %zu", ga->n, gb->n);
    for (size_t i = 0; i < gb->n; i++) {
        cr_assert(ga->items[i]->type == TR_JSON_ARRAY && ga->items[i]->n == 2);
        same_strings(ga->items[i]->items[0], gb->items[i]->items[0], "merge (left)", i);
        same_strings(ga->items[i]->items[1], gb->items[i]->items[1], "merge (right)", i);
    }
    const struct tr_json *added = tr_json_get(a, "added_tokens");
    cr_assert(added && added->n == 1);
    cr_assert_str_eq(tr_json_string(added->items[0], "content"), TR_BPE_EOS);
    cr_assert_eq(tr_json_number(added->items[0], "id", -1), 0);
    tr_json_free(a);
    tr_json_free(b);
    free(lib);

    /* the committed trained.json (whose ids the library computed) is what we write now */
    size_t tlen;
    char *committed = tr_test_slurp(FIX "trained.json", &tlen);
    int same = tlen == len && memcmp(committed, ours, len) == 0;
    if (!same) {
        FILE *f = fopen("tests/test_bpe_train.out.json", "wb");
        if (f) {
            fwrite(ours, 1, len, f);
            fclose(f);
        }
    }
    cr_assert(same, "the trainer's tokenizer.json changed: it is in tests/test_bpe_train.out.json "
                    "of the build directory; see tests/torch/make_bpe_train_fixtures.py");
    free(committed);
    free(ours);
}

Test(bpe_train, ids_equal_the_library_and_decode_back)
{
    size_t len, n, ilen;
    char *ours = train_fixture(VOCAB, &len, NULL);
    tr_err err = { { 0 } };
    struct tr_tokenizer *t = tr_tokenizer_parse(ours, len, "trained", &err);
    cr_assert(t, "tokenizer.c refuses the trained file: %s", err.msg);
    cr_assert_eq(tr_tokenizer_vocab_size(t), (size_t)VOCAB);
    cr_assert_eq(tr_tokenizer_token_id(t, TR_BPE_EOS), 0);
    char *text = tr_test_slurp(FIX "encode.txt", &n), *idtext = tr_test_slurp(FIX "ids.json", &ilen);
    struct tr_json *want = parse(idtext, ilen, "ids.json");
    const struct tr_json *w = tr_json_get(want, "encode.txt");
    cr_assert(w && w->type == TR_JSON_ARRAY);
    int32_t *ids;
    size_t nids;
    cr_assert_eq(tr_tokenizer_encode(t, text, n, &ids, &nids, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < nids && i < w->n; i++)
        cr_assert_eq(ids[i], (int32_t)w->items[i]->number, "id %zu is %d, the library says %d", i, ids[i],
                     (int)w->items[i]->number);
    cr_assert_eq(nids, w->n, "%zu ids, the library gives %zu", nids, w->n);
    cr_assert_lt(nids, n / 2, "%zu ids for %zu bytes: the merges do not apply", nids, n);
    char *back;
    size_t blen;
    cr_assert_eq(tr_tokenizer_decode(t, ids, nids, &back, &blen, &err), 0, "%s", err.msg);
    cr_assert(blen == n && memcmp(back, text, n) == 0, "decode(encode(x)) != x");
    free(back);
    free(ids);
    tr_json_free(want);
    free(idtext);
    free(text);
    tr_tokenizer_free(t);
    free(ours);
}

/* ids 1..256 are the byte symbols: the loader must read each back as one distinct byte, and
 * in the library's order (by the byte-level character's code point). */
Test(bpe_train, byte_symbols_cover_every_byte)
{
    tr_err err = { { 0 } };
    struct tr_bpe_trainer *b = tr_bpe_trainer_new(&err);
    cr_assert(b, "%s", err.msg);
    char *json;
    size_t len;
    struct tr_bpe_stats st;
    cr_assert_eq(tr_bpe_trainer_train(b, 257, 0, EOS, 1, &json, &len, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(st.merges, 0);
    struct tr_tokenizer *t = tr_tokenizer_parse(json, len, "bytes", &err);
    cr_assert(t, "%s", err.msg);
    int seen[256] = { 0 };
    for (int32_t id = 1; id <= 256; id++) {
        char *out;
        size_t n;
        cr_assert_eq(tr_tokenizer_decode(t, &id, 1, &out, &n, &err), 0, "%s", err.msg);
        cr_assert_eq(n, 1, "id %d decodes to %zu bytes", id, n);
        cr_assert_eq(seen[(unsigned char)out[0]]++, 0, "byte %d twice", (unsigned char)out[0]);
        free(out);
    }
    /* '!' is the smallest code point, byte 0 (U+0100) comes right after the 188 bytes that
     * stand for themselves */
    int32_t bang = 1, zero = 189;
    char *out;
    size_t n;
    tr_tokenizer_decode(t, &bang, 1, &out, &n, &err);
    cr_assert_eq(out[0], '!');
    free(out);
    tr_tokenizer_decode(t, &zero, 1, &out, &n, &err);
    cr_assert_eq(out[0], 0);
    free(out);
    tr_tokenizer_free(t);
    free(json);
    tr_bpe_trainer_free(b);
}

static struct tr_json *train_text(const char *text, size_t vocab, uint64_t min_frequency,
                                  struct tr_bpe_stats *st)
{
    tr_err err = { { 0 } };
    struct tr_bpe_trainer *b = tr_bpe_trainer_new(&err);
    cr_assert_eq(tr_bpe_trainer_feed(b, text, strlen(text), &err), 0, "%s", err.msg);
    char *json;
    size_t len;
    cr_assert_eq(tr_bpe_trainer_train(b, vocab, min_frequency, EOS, 1, &json, &len, st, &err), 0, "%s",
                 err.msg);
    tr_bpe_trainer_free(b);
    struct tr_json *j = parse(json, len, "tokenizer.json");
    free(json);
    return j;
}

static void check_merges(const struct tr_json *j, const char *const (*want)[2], size_t n)
{
    const struct tr_json *m = tr_json_get(tr_json_get(j, "model"), "merges");
    cr_assert_eq(m->n, n, "%zu merges, not %zu", m->n, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(m->items[i]->items[0]->string, want[i][0], "merge %zu", i);
        cr_assert_str_eq(m->items[i]->items[1]->string, want[i][1], "merge %zu", i);
    }
}

/* Words "ab", " ab" twice, " ba": (a,b) 3 times first, then (Ġ,ab) twice; then (Ġ,b) and
 * (b,a) are tied at once each, and the pair with the smaller ids goes first: b (id 66) is
 * below Ġ (U+0120, a byte symbol placed after the 188 printable ones); nothing is left after
 * (Ġ,ba), so the vocabulary stops short of what was asked. */
Test(bpe_train, most_frequent_first_ties_by_smaller_ids)
{
    struct tr_bpe_stats st;
    struct tr_json *j = train_text("ab ab ab ba", 300, 0, &st);
    static const char *const want[][2] = {{"a", "b"}, {"Ġ", "ab"}, {"b", "a"}, {"Ġ", "ba"}};
    check_merges(j, want, 4);
    cr_assert_eq(st.vocab, 261, "the vocabulary has %zu entries, not 1 + 256 + 4", st.vocab);
    cr_assert_eq(st.words, 4);
    cr_assert_eq(st.unique_words, 3);
    tr_json_free(j);

    /* min_frequency 2 stops before the pairs seen once */
    j = train_text("ab ab ab ba", 300, 2, &st);
    check_merges(j, want, 2);
    tr_json_free(j);

    /* the requested size counts the special token: 259 = 1 + 256 + 2 merges */
    j = train_text("ab ab ab ba", 259, 0, &st);
    check_merges(j, want, 2);
    cr_assert_eq(st.vocab, 259);
    tr_json_free(j);
}

/* "aaaa": merging (a,a) left to right gives [aa, aa]; the neighbour counts must follow, so the
 * next merge is (aa,aa), not a stale (aa,a). */
Test(bpe_train, overlapping_pairs_count_as_the_library_counts_them)
{
    struct tr_bpe_stats st;
    struct tr_json *j = train_text("aaaa", 300, 0, &st);
    static const char *const want[][2] = {{"a", "a"}, {"aa", "aa"}};
    check_merges(j, want, 2);
    tr_json_free(j);
}

Test(bpe_train, refuses_what_it_cannot_do)
{
    tr_err err = { { 0 } };
    struct tr_bpe_trainer *b = tr_bpe_trainer_new(&err);
    char *json;
    size_t len;
    cr_assert_neq(tr_bpe_trainer_train(b, 256, 0, EOS, 1, &json, &len, NULL, &err), 0);
    cr_assert(strstr(err.msg, "at least 257"), "%s", err.msg);
    cr_assert_null(json);
    cr_assert_neq(tr_bpe_trainer_train(b, (size_t)TR_BPE_MAX_VOCAB + 1, 0, EOS, 1, &json, &len, NULL, &err), 0);
    cr_assert_neq(tr_bpe_trainer_feed(b, "caf\xe9", 4, &err), 0, "Latin-1 text is not UTF-8");
    cr_assert(strstr(err.msg, "UTF-8"), "%s", err.msg);
    static const char *const twice[] = {"<s>", "<s>"};
    cr_assert_neq(tr_bpe_trainer_train(b, 300, 0, twice, 2, &json, &len, NULL, &err), 0);
    cr_assert(strstr(err.msg, "twice"), "%s", err.msg);
    tr_bpe_trainer_free(b);
}
