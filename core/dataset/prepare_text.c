/*
 * `trainrun prepare` of text (see dataset.h): every input is read whole
 * (plain, gzip or zstd: prepare_input.c), split into documents (blank-line separated paragraphs,
 * or one per line), deduplicated, and written as TRTOKENS shards
 * (train_000000.bin ..., val_000000.bin ...) with prepare.json describing
 * what was done.  Each document is followed by the separator it was split
 * at ("\n\n" or "\n"), so the token stream reads like the input with the
 * duplicates taken out.  Validation is the smallest run of whole documents
 * at the end holding at least val_fraction of the tokens.
 *
 * Deduplication (exact, or near: MinHash with LSH banding) is in dedup.c;
 * this file splits, reports what was removed and writes (through the shard
 * writer of prepare_shards.c).  The
 * command line is commands/prepare.c's, the output directory prepare_output.c's.
 */
#include "dataset.h"

#include "dedup.h"
#include "prepare_internal.h"

#include "../util/json.h"
#include "../util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct input {
    const char *path;
    unsigned char *data;
    size_t size;
};

/* ---- documents ------------------------------------------------------------ */

static int add_doc(struct docs *d, const unsigned char *text, size_t len, int input, long line)
{
    if (d->n == d->cap) {
        size_t grown = d->cap ? d->cap * 2 : 1024;
        struct doc *v = realloc(d->v, grown * sizeof *v);
        if (!v)
            return tr_prepare_fail("out of memory (%zu documents so far)", d->n);
        d->v = v;
        d->cap = grown;
    }
    d->v[d->n++] = (struct doc){.text = text, .len = len, .input = input, .line = line};
    return 0;
}

/* Split one input into documents: paragraphs separated by blank lines (only
 * whitespace), or every non-blank line.  Line ends are not part of a
 * document; neither is the "\r" of a "\r\n". */
static int split_documents(struct docs *d, const struct input *in, int input, int by_line)
{
    const unsigned char *p = in->data, *end = in->data + in->size;
    const unsigned char *doc_start = NULL, *doc_end = NULL;
    long doc_line = 0;
    for (long line = 1; p < end; line++) {
        const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
        const unsigned char *line_end = nl ? nl : end;
        const unsigned char *content_end = line_end;
        if (content_end > p && content_end[-1] == '\r')
            content_end--;
        int blank = 1;
        for (const unsigned char *c = p; c < content_end && blank; c++)
            blank = is_space(*c);
        if (by_line) {
            if (!blank && add_doc(d, p, (size_t)(content_end - p), input, line) != 0)
                return -1;
        } else if (blank) {
            if (doc_start && add_doc(d, doc_start, (size_t)(doc_end - doc_start), input,
                                     doc_line) != 0)
                return -1;
            doc_start = NULL;
        } else {
            if (!doc_start) {
                doc_start = p;
                doc_line = line;
            }
            doc_end = content_end;
        }
        p = nl ? nl + 1 : end;
    }
    if (doc_start && add_doc(d, doc_start, (size_t)(doc_end - doc_start), input, doc_line) != 0)
        return -1;
    return 0;
}

/* ---- JSONL -------------------------------------------------------------------- */

/* The documents of JSONL inputs are the text fields' decoded strings,
 * copied into chunks that live as long as the documents. */
struct arena {
    struct chunk {
        struct chunk *next;
        size_t used, cap;
        unsigned char data[];
    } *head;
};

static const unsigned char *arena_copy(struct arena *a, const char *s, size_t n)
{
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > (4u << 20) ? n : (4u << 20);
        struct chunk *c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        *c = (struct chunk){.next = a->head, .cap = cap};
        a->head = c;
    }
    unsigned char *at = a->head->data + a->head->used;
    memcpy(at, s, n);
    a->head->used += n;
    return at;
}

static void arena_free(struct arena *a)
{
    while (a->head) {
        struct chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
}

struct jsonl_counts {
    size_t bad, empty; /* records skipped (--skip-bad-records), empty texts */
};

static const char *json_type_name(enum tr_json_type t)
{
    static const char *const names[] = {"null", "a boolean", "a number", "a string",
                                        "an array", "an object"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "a value";
}

/* A record that cannot be a document: an error, or with --skip-bad-records
 * a warning (the first few) and a count. */
static int bad_record(const struct prepare_opts *o, struct jsonl_counts *c, const char *msg)
{
    if (!o->skip_bad_records)
        return tr_prepare_fail("%s (or pass --skip-bad-records to skip such records)", msg);
    if (++c->bad <= SAMPLES_SHOWN)
        fprintf(stderr, "trainrun prepare: warning: %s; skipped\n", msg);
    return 0;
}

/* One document per record of a JSONL input: the string field o->text_field. */
static int split_jsonl(struct docs *d, struct arena *a, const struct input *in, int input,
                       const struct prepare_opts *o, struct jsonl_counts *c)
{
    struct tr_jsonl it;
    tr_jsonl_init(&it, in->path, in->data, in->size);
    for (;;) {
        struct tr_json *rec;
        int got = tr_jsonl_next(&it, &rec);
        if (got == 0)
            return 0;
        if (got < 0) {
            if (bad_record(o, c, it.error) != 0)
                return -1;
            continue;
        }
        const struct tr_json *field = tr_json_get(rec, o->text_field);
        char msg[1024];
        int rc = 0;
        if (!field || field->type != TR_JSON_STRING) {
            int n = snprintf(msg, sizeof msg, "%s:%ld: ", in->path, it.line);
            if (field)
                snprintf(msg + n, sizeof msg - (size_t)n,
                         "field \"%s\" is %s, not a string", o->text_field,
                         json_type_name(field->type));
            else {
                n += snprintf(msg + n, sizeof msg - (size_t)n,
                              "the record has no field \"%s\" (its fields:", o->text_field);
                for (size_t k = 0; k < rec->n && n < (int)sizeof msg - 80; k++)
                    n += snprintf(msg + n, sizeof msg - (size_t)n, "%s \"%.40s\"", k ? "," : "",
                                  rec->keys[k]);
                snprintf(msg + n, sizeof msg - (size_t)n, "%s); name the text field with "
                         "--text-field NAME", rec->n ? "" : " none");
            }
            rc = bad_record(o, c, msg);
        } else {
            size_t len = strlen(field->string);
            const unsigned char *text = len ? arena_copy(a, field->string, len) : NULL;
            if (len == 0)
                c->empty++;
            else if (!text)
                rc = tr_prepare_fail("out of memory reading %s (%zu documents so far)", in->path,
                                     d->n);
            else
                rc = add_doc(d, text, len, input, it.line);
        }
        tr_json_free(rec);
        if (rc != 0)
            return -1;
    }
}

/* The first 60 bytes of a document on one line (whitespace runs shown as
 * one space), without cutting a UTF-8 character. */
static void snippet(const struct doc *doc, char *out, size_t size)
{
    size_t o = 0, limit = 60 < size - 4 ? 60 : size - 4, i = 0;
    int space = 0;
    while (i < doc->len && o < limit) {
        unsigned char c = doc->text[i];
        if (is_space(c)) {
            space = 1;
            i++;
            continue;
        }
        if (space && o > 0)
            out[o++] = ' ';
        space = 0;
        if (o >= limit)
            break;
        size_t seq = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        if (o + seq > limit || i + seq > doc->len)
            break;
        memcpy(out + o, doc->text + i, seq);
        o += seq;
        i += seq;
    }
    while (i < doc->len && is_space(doc->text[i]))
        i++;
    int more = i < doc->len;
    out[o] = '\0';
    if (more)
        strcpy(out + o, "...");
}

static void print_removed(const struct docs *d, const struct input *inputs, enum removal kind)
{
    int shown = 0;
    for (size_t i = 0; i < d->n && shown < SAMPLES_SHOWN; i++) {
        const struct doc *doc = &d->v[i];
        if (doc->removed != kind)
            continue;
        const struct doc *orig = &d->v[doc->dup_of];
        char a[80], b[80];
        snippet(doc, a, sizeof a);
        snippet(orig, b, sizeof b);
        printf("  %s:%ld \"%s\"\n", inputs[doc->input].path, doc->line, a);
        if (kind == NEAR_DUP)
            printf("    is like %s:%ld (similarity %.2f) \"%s\"\n", inputs[orig->input].path,
                   orig->line, doc->similarity, b);
        else
            printf("    repeats %s:%ld \"%s\"\n", inputs[orig->input].path, orig->line, b);
        shown++;
    }
}

/* ---- shards ---------------------------------------------------------------- */

static void json_shard_list(FILE *f, const char *prefix, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\"%s_%06d.bin\"", i ? ", " : "", prefix, i);
    fputc(']', f);
}

/* ---- text ------------------------------------------------------------------ */

struct text_result {
    size_t read, removed_exact, removed_near;
    struct jsonl_counts jsonl;
    int any_jsonl;
    size_t docs[2];      /* train, val */
    uint64_t tokens[2], bytes[2];
    int shards[2];
    int token_bytes;
    uint32_t vocab;
    unsigned char table[256]; /* char tokenizer: token id -> byte */
};

/* prepare.json's "tokenizer": "byte" or "char", or for a tokenizer.json
 * what it is and where it came from. */
static void json_tokenizer(FILE *f, const struct prepare_opts *o, const struct prepare_tokenizer *pt)
{
    if (!pt) {
        fprintf(f, "  \"tokenizer\": \"%s\",\n", o->tokenizer);
        return;
    }
    fputs("  \"tokenizer\": {\"file\": \"tokenizer.json\", \"source\": ", f);
    tr_json_write_string(f, pt->path);
    fprintf(f, ", \"hash\": \"%016llx\", \"vocab\": %u, \"eos\": ", (unsigned long long)pt->hash,
            pt->vocab);
    if (pt->eos >= 0)
        fprintf(f, "%d", (int)pt->eos);
    else
        fputs("null", f);
    fprintf(f, "%s},\n", pt->config ? ", \"config\": \"tokenizer_config.json\"" : "");
}

static int write_text_json(const struct prepare_opts *o, const struct text_result *r, int rows,
                           const struct prepare_tokenizer *pt)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/prepare.json", o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    fputs("{\n  \"format\": \"text\",\n", f);
    tr_prepare_json_inputs(f, o);
    json_tokenizer(f, o, pt);
    fprintf(f, "  \"vocab\": %u,\n  \"dtype\": \"%s\",\n", r->vocab,
            r->token_bytes == 4 ? "uint32" : "uint16");
    if (r->any_jsonl) {
        fputs("  \"text_field\": ", f);
        tr_json_write_string(f, o->text_field);
        fputs(",\n", f);
    }
    fprintf(f, "  \"doc_separator\": \"%s\",\n  \"dedup\": \"%s\",\n", o->doc_separator,
            o->dedup);
    if (strcmp(o->dedup, "near") == 0)
        fprintf(f, "  \"near_threshold\": %g,\n  \"minhash\": {\"functions\": %d, \"bands\": %d, "
                   "\"rows\": %d, \"shingle\": %d},\n",
                o->near_threshold, MINHASH_FUNCS, MINHASH_FUNCS / rows, rows, SHINGLE);
    fprintf(f,
            "  \"documents\": {\"read\": %zu, \"kept\": %zu, \"removed_exact\": %zu, "
            "\"removed_near\": %zu, \"skipped_bad\": %zu, \"skipped_empty\": %zu},\n",
            r->read, r->docs[0] + r->docs[1], r->removed_exact, r->removed_near, r->jsonl.bad,
            r->jsonl.empty);
    fprintf(f, "  \"val_fraction\": %g,\n  \"shard_tokens\": %llu,\n", o->val_fraction,
            (unsigned long long)o->shard_tokens);
    static const char *const names[2] = {"train", "val"};
    for (int s = 0; s < 2; s++) {
        fprintf(f, "  \"%s\": {\"documents\": %zu, \"tokens\": %llu, \"bytes\": %llu, \"shards\": ",
                names[s], r->docs[s], (unsigned long long)r->tokens[s],
                (unsigned long long)r->bytes[s]);
        json_shard_list(f, names[s], r->shards[s]);
        fputs("},\n", f);
    }
    fputs("  \"chars\": ", f);
    if (strcmp(o->tokenizer, "char") == 0) {
        fputc('[', f);
        for (uint32_t i = 0; i < r->vocab; i++)
            fprintf(f, "%s%u", i ? ", " : "", r->table[i]);
        fputs("]\n", f);
    } else {
        fputs("null\n", f);
    }
    fputs("}\n", f);
    return tr_prepare_publish(tmp, path, f);
}

/* byte and char: every byte is a token, and each document is followed by
 * its separator. */
static int put_bytes(struct tr_shard_writer *w, const uint16_t *ids, const unsigned char *text,
                     size_t len)
{
    for (size_t k = 0; k < len; k++) {
        if (tr_shard_writer_put(w, ids[text[k]], 1) != 0)
            return -1;
        tr_shard_writer_add_text_bytes(w, 1);
    }
    return 0;
}

static int write_split(const struct prepare_opts *o, const struct docs *d, size_t from,
                       size_t to, const uint16_t *ids, const char *sep, size_t sep_len,
                       struct prepare_tokenizer *pt, struct prepare_progress *progress,
                       const char *prefix, struct text_result *r, int split)
{
    struct tr_shard_writer *w = tr_shard_writer_open(o->out_dir, prefix, o->shard_tokens,
                                                     r->vocab, 0);
    if (!w)
        return -1;
    int rc = 0;
    for (size_t i = from; i < to; i++)
        r->docs[split] += !d->v[i].removed;
    if (pt) {
        rc = tr_prepare_encode_docs(pt, d, from, to, o->inputs, w, progress);
    } else {
        for (size_t i = from; i < to && rc == 0; i++) {
            const struct doc *doc = &d->v[i];
            if (doc->removed)
                continue;
            rc = put_bytes(w, ids, doc->text, doc->len);
            if (rc == 0)
                rc = put_bytes(w, ids, (const unsigned char *)sep, sep_len);
            tr_prepare_progress_add(progress, doc->len);
            tr_prepare_progress_draw(progress, 0);
        }
    }
    if (rc == 0)
        rc = tr_shard_writer_finish(w);
    r->tokens[split] = tr_shard_writer_tokens(w);
    r->bytes[split] = tr_shard_writer_text_bytes(w);
    r->shards[split] = tr_shard_writer_shards(w);
    r->token_bytes = tr_shard_writer_token_bytes(w);
    tr_shard_writer_free(w);
    if (rc == 0)
        tr_prepare_remove_stale_shards(o->out_dir, prefix, r->shards[split]);
    return rc;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

/* One text prepare: the documents and what is learned about them on the way. */
struct text_run {
    const struct prepare_opts *o;
    const struct input *inputs;
    struct docs d;
    struct arena arena;
    struct text_result r;
    int by_line, is_file, rows;
    const char *sep;              /* the separator put after each document (byte, char) */
    size_t sep_len;               /* 0 with a tokenizer.json */
    size_t kept, val_from;        /* validation: the documents from val_from on */
    uint64_t kept_bytes;
    uint16_t ids[256];            /* byte and char: each byte's token id */
    struct prepare_tokenizer tokenizer, *pt; /* pt: &tokenizer once loaded */
    int workers;
};

/* Every input split into documents, and what was read said. */
static int read_documents(struct text_run *t)
{
    const struct prepare_opts *o = t->o;
    struct text_result *r = &t->r;
    int rc = 0;
    size_t bytes = 0;
    for (int i = 0; i < o->n_inputs && rc == 0; i++) {
        if (tr_prepare_is_jsonl(t->inputs[i].path)) {
            r->any_jsonl = 1;
            rc = split_jsonl(&t->d, &t->arena, &t->inputs[i], i, o, &r->jsonl);
        } else {
            rc = split_documents(&t->d, &t->inputs[i], i, t->by_line);
        }
        bytes += t->inputs[i].size;
    }
    if (rc != 0)
        return rc;
    r->read = t->d.n;
    int all_jsonl = 1;
    for (int i = 0; i < o->n_inputs; i++)
        all_jsonl &= tr_prepare_is_jsonl(t->inputs[i].path);
    const char *txt = t->by_line ? "one per line" : "separated by blank lines";
    printf("trainrun prepare: %d input%s, %zu bytes, %zu document%s (%s%s%s)\n", o->n_inputs,
           o->n_inputs == 1 ? "" : "s", bytes, t->d.n, t->d.n == 1 ? "" : "s",
           r->any_jsonl ? "one per JSONL record" : txt, r->any_jsonl && !all_jsonl ? "; text: " : "",
           r->any_jsonl && !all_jsonl ? txt : "");
    if (r->jsonl.bad)
        fprintf(stderr, "trainrun prepare: warning: skipped %zu bad record%s (--skip-bad-records)\n",
                r->jsonl.bad, r->jsonl.bad == 1 ? "" : "s");
    if (r->jsonl.empty)
        printf("trainrun prepare: %zu record%s with an empty \"%s\" skipped\n", r->jsonl.empty,
               r->jsonl.empty == 1 ? "" : "s", o->text_field);
    if (t->d.n == 0)
        return tr_prepare_fail("no documents in the input%s (%s); check the input files",
                               o->n_inputs == 1 ? "" : "s",
                               r->any_jsonl ? "no record with a non-empty text field, no non-blank line"
                                            : "every line is blank");
    return 0;
}

/* --dedup exact and near, each pass's removals said and shown. */
static int deduplicate(struct text_run *t)
{
    const struct prepare_opts *o = t->o;
    struct text_result *r = &t->r;
    int rc;
    if (strcmp(o->dedup, "none") != 0) {
        if ((rc = dedup_exact(&t->d, &r->removed_exact)) != 0)
            return rc;
        printf("trainrun prepare: exact dedup removed %zu document%s\n", r->removed_exact,
               r->removed_exact == 1 ? "" : "s");
        print_removed(&t->d, t->inputs, EXACT_DUP);
    }
    if (strcmp(o->dedup, "near") == 0) {
        if ((rc = dedup_near(&t->d, o->near_threshold, t->rows, &r->removed_near)) != 0)
            return rc;
        printf("trainrun prepare: near dedup (MinHash, %d functions in %d bands of %d, "
               "threshold %.2f) removed %zu document%s\n",
               MINHASH_FUNCS, MINHASH_FUNCS / t->rows, t->rows, o->near_threshold, r->removed_near,
               r->removed_near == 1 ? "" : "s");
        print_removed(&t->d, t->inputs, NEAR_DUP);
    }
    return 0;
}

/* The kept documents, counted; and the validation split: whole documents from the end, at
 * least val_fraction of the tokens (byte, char) or of the text's bytes (a tokenizer.json,
 * whose token counts are known only once encoded), always leaving one training document. */
static void split_validation(struct text_run *t)
{
    const struct docs *d = &t->d;
    for (size_t i = 0; i < d->n; i++)
        if (!d->v[i].removed) {
            t->kept++;
            t->kept_bytes += d->v[i].len;
        }
    uint64_t total = 0;
    size_t first_kept = d->n;
    for (size_t i = 0; i < d->n; i++) {
        if (d->v[i].removed)
            continue;
        total += d->v[i].len + t->sep_len;
        if (first_kept == d->n)
            first_kept = i;
    }
    uint64_t want = (uint64_t)((double)total * t->o->val_fraction), val_tokens = 0;
    size_t val_from = d->n;
    while (want > 0 && val_tokens < want && val_from > first_kept + 1) {
        val_from--;
        if (!d->v[val_from].removed)
            val_tokens += d->v[val_from].len + t->sep_len;
    }
    while (val_from < d->n && d->v[val_from].removed)
        val_from++; /* start the split at a kept document */
    if (want > 0 && val_from == d->n)
        fprintf(stderr, "trainrun prepare: warning: only one document is left, so there is no "
                        "validation split; use data.val_fraction in the recipe instead\n");
    t->val_from = val_from;
}

/* A tokenizer.json (trained first with --train-tokenizer), loaded for the workers. */
static int open_tokenizer(struct text_run *t)
{
    const struct prepare_opts *o = t->o;
    int rc;
    t->workers = o->workers ? o->workers : online_cpus();
    if ((size_t)t->workers > t->kept)
        t->workers = (int)t->kept;
    /* --train-tokenizer: the tokenizer.json comes from the training documents */
    if (o->train_tokenizer) {
        if (tr_mkdir_p(o->out_dir) != 0)
            return tr_prepare_fail("cannot create the output directory %s: %s", o->out_dir,
                                   strerror(errno));
        if ((rc = tr_prepare_claim_out_dir(o->out_dir)) != 0 ||
            (rc = tr_prepare_train_tokenizer(o->out_dir, o->train_tokenizer, &t->d, t->val_from,
                                             (const char *const *)o->inputs)) != 0)
            return rc;
    }
    if ((rc = tr_prepare_tokenizer_load(&t->tokenizer, o, t->workers)) != 0) {
        tr_prepare_tokenizer_free(&t->tokenizer);
        return rc;
    }
    struct prepare_tokenizer *pt = t->pt = &t->tokenizer;
    t->workers = pt->workers; /* fewer when a copy could not be made */
    t->r.vocab = pt->vocab;
    char eos[200];
    if (pt->eos >= 0)
        snprintf(eos, sizeof eos, "EOS %.80s (id %d, from %s) after each document",
                 pt->eos_text ? pt->eos_text : "?", (int)pt->eos, pt->eos_from);
    else
        snprintf(eos, sizeof eos, "no EOS between documents (%s)", pt->eos_from);
    printf("trainrun prepare: tokenizer %s: vocabulary %u, %s\n", pt->path, pt->vocab, eos);
    return 0;
}

/* char: the distinct bytes of the kept documents and the separator, sorted, are the
 * vocabulary; byte: all 256. */
static void byte_tokens(struct text_run *t, int chars)
{
    struct text_result *r = &t->r;
    if (!chars) {
        for (int c = 0; c < 256; c++)
            t->ids[c] = (uint16_t)c;
        r->vocab = 256;
        return;
    }
    unsigned char seen[256] = {0};
    for (size_t i = 0; i < t->d.n; i++)
        if (!t->d.v[i].removed)
            for (size_t k = 0; k < t->d.v[i].len; k++)
                seen[t->d.v[i].text[k]] = 1;
    for (size_t k = 0; k < t->sep_len; k++)
        seen[(unsigned char)t->sep[k]] = 1;
    for (int c = 0; c < 256; c++) {
        if (seen[c]) {
            t->ids[c] = (uint16_t)r->vocab;
            r->table[r->vocab++] = (unsigned char)c;
        }
    }
}

/* The tokenizer beside the shards, where the tokens plugin finds it (or, for byte and char,
 * no stale one). */
static int write_tokenizer_files(const struct text_run *t)
{
    const char *dir = t->o->out_dir;
    const struct prepare_tokenizer *pt = t->pt;
    if (!pt) {
        tr_prepare_remove_stale_file(dir, "tokenizer.json");
        tr_prepare_remove_stale_file(dir, "tokenizer_config.json");
        return 0;
    }
    int rc = tr_prepare_write_copy(dir, "tokenizer.json", pt->file, pt->file_size);
    if (rc == 0 && pt->config)
        rc = tr_prepare_write_copy(dir, "tokenizer_config.json", pt->config, pt->config_size);
    if (rc != 0)
        return rc;
    if (!pt->config)
        tr_prepare_remove_stale_file(dir, "tokenizer_config.json");
    return 0;
}

/* OUTDIR: the train and val shards, the tokenizer files and prepare.json. */
static int write_outputs(struct text_run *t)
{
    const struct prepare_opts *o = t->o;
    struct prepare_progress *progress = NULL;
    int rc;
    if (tr_mkdir_p(o->out_dir) != 0)
        return tr_prepare_fail("cannot create the output directory %s: %s", o->out_dir, strerror(errno));
    if ((rc = tr_prepare_claim_out_dir(o->out_dir)) != 0)
        return rc;
    if (!(progress = tr_prepare_progress_start(t->kept_bytes, t->workers)))
        return tr_prepare_fail("out of memory");
    if ((rc = write_split(o, &t->d, 0, t->val_from, t->ids, t->sep, t->sep_len, t->pt, progress,
                          "train", &t->r, 0)) != 0 ||
        (rc = write_split(o, &t->d, t->val_from, t->d.n, t->ids, t->sep, t->sep_len, t->pt,
                          progress, "val", &t->r, 1)) != 0) {
        tr_prepare_progress_end(progress, 0);
        return rc;
    }
    tr_prepare_progress_end(progress, 1);
    if ((rc = write_tokenizer_files(t)) != 0)
        return rc;
    return write_text_json(o, &t->r, t->rows, t->pt);
}

/* What was written, and the data table that reads it. */
static void print_summary(const struct text_run *t)
{
    const struct prepare_opts *o = t->o;
    const struct text_result *r = &t->r;
    printf("trainrun prepare: %s tokens, vocabulary %u: train %llu tokens (%zu document%s) in "
           "%d shard%s, val %llu tokens (%zu document%s) in %d shard%s\n",
           t->pt ? "tokenizer.json" : o->tokenizer, r->vocab, (unsigned long long)r->tokens[0],
           r->docs[0], r->docs[0] == 1 ? "" : "s", r->shards[0], r->shards[0] == 1 ? "" : "s",
           (unsigned long long)r->tokens[1], r->docs[1], r->docs[1] == 1 ? "" : "s", r->shards[1],
           r->shards[1] == 1 ? "" : "s");
    if (t->pt && r->tokens[0] + r->tokens[1])
        printf("trainrun prepare: %.3f bytes of text per token\n",
               (double)(r->bytes[0] + r->bytes[1]) / (double)(r->tokens[0] + r->tokens[1]));
    printf("trainrun prepare: wrote %s/prepare.json; use\n"
           "  data = { plugin = \"tokens\", train = \"%s/train_*.bin\"%s%s%s }\n",
           o->out_dir, o->out_dir, r->shards[1] ? ", val = \"" : ", val_fraction = 0",
           r->shards[1] ? o->out_dir : "", r->shards[1] ? "/val_*.bin\"" : "");
}

/* Read, split, deduplicate, pick validation, tokenise and write. */
static int prepare_text(const struct prepare_opts *o, struct input *inputs)
{
    struct text_run t = {.o = o, .inputs = inputs, .workers = 1};
    t.by_line = strcmp(o->doc_separator, "line") == 0;
    t.is_file = strcmp(o->tokenizer, "byte") != 0 && strcmp(o->tokenizer, "char") != 0;
    t.sep = t.by_line ? "\n" : "\n\n";
    t.sep_len = t.is_file ? 0 : strlen(t.sep);
    t.rows = band_rows(o->near_threshold);
    int rc = read_documents(&t);
    if (rc == 0)
        rc = deduplicate(&t);
    if (rc == 0) {
        split_validation(&t);
        if (t.is_file)
            rc = open_tokenizer(&t);
        else
            byte_tokens(&t, strcmp(o->tokenizer, "char") == 0);
    }
    if (rc == 0)
        rc = write_outputs(&t);
    if (rc == 0)
        print_summary(&t);
    if (t.pt)
        tr_prepare_tokenizer_free(t.pt);
    free(t.d.v);
    arena_free(&t.arena);
    return rc;
}

int tr_prepare_text(const struct prepare_opts *o)
{
    struct input *inputs = calloc((size_t)o->n_inputs, sizeof *inputs);
    int rc = inputs ? 0 : tr_prepare_fail("out of memory");
    for (int i = 0; i < o->n_inputs && rc == 0; i++) {
        inputs[i].path = o->inputs[i];
        rc = tr_prepare_read_input(inputs[i].path, &inputs[i].data, &inputs[i].size);
    }
    if (rc == 0)
        rc = prepare_text(o, inputs);
    for (int i = 0; inputs && i < o->n_inputs; i++)
        free(inputs[i].data);
    free(inputs);
    return rc;
}
