/*
 * `trainrun prepare --tokenizer tokenizer.json` (see prepare_internal.h):
 * the tokenizer loaded once per worker thread, the EOS found, documents
 * encoded in parallel and written in their order, and the progress bar.
 *
 * Documents are taken in batches of about BATCH_BYTES of text; within a
 * batch the workers take the next document from a shared counter (so a
 * long document does not hold the others up), and when the batch is done
 * the calling thread writes its documents in order.  The shards therefore
 * do not depend on the number of workers.  The calling thread is worker 0
 * and redraws the progress bar between its documents.
 */
#include "dataset.h"

#include "dedup.h"
#include "prepare_internal.h"

#include "../util/json.h"
#include "../util/progress.h"
#include "../tokenizer/tokenizer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BATCH_BYTES (16u << 20)
#define BATCH_DOCS 65536

static double clock_s(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- progress ------------------------------------------------------------------ */

/* The bar is core/util's; prepare adds the summary with CPU seconds. */
struct prepare_progress {
    struct tr_progress *bar;
    double cpu_start; /* CPU time of the process (all threads) */
    int workers;
};

struct prepare_progress *tr_prepare_progress_start(uint64_t total, int workers)
{
    struct prepare_progress *p = calloc(1, sizeof *p);
    if (!p || !(p->bar = tr_progress_start("tokenizing", total))) {
        free(p);
        return NULL;
    }
    p->workers = workers;
    p->cpu_start = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    return p;
}

void tr_prepare_progress_add(struct prepare_progress *p, uint64_t bytes)
{
    if (p)
        tr_progress_add(p->bar, bytes);
}

void tr_prepare_progress_draw(struct prepare_progress *p, int force)
{
    if (p)
        tr_progress_draw(p->bar, force);
}

void tr_prepare_progress_end(struct prepare_progress *p, int ok)
{
    if (!p)
        return;
    double elapsed = tr_progress_elapsed(p->bar);
    uint64_t done = tr_progress_done(p->bar);
    tr_progress_end(p->bar, ok, 0);
    /* CPU seconds too: on a shared machine they say what a core does */
    double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - p->cpu_start;
    if (ok)
        printf("trainrun prepare: tokenized %.2f MB in %.2f s, %.1f MB/s with %d worker%s "
               "(%.2f s of CPU, %.1f MB per CPU second)\n",
               (double)done / 1e6, elapsed, elapsed > 0 ? (double)done / 1e6 / elapsed : 0.0,
               p->workers, p->workers == 1 ? "" : "s", cpu,
               cpu > 0 ? (double)done / 1e6 / cpu : 0.0);
    free(p);
}

/* ---- the tokenizer ----------------------------------------------------------- */

/* eos_token of a tokenizer_config.json: a string, or {"content": "..."}. */
static const char *config_eos(const struct tr_json *config)
{
    const struct tr_json *e = tr_json_get(config, "eos_token");
    if (e && e->type == TR_JSON_STRING)
        return e->string;
    if (e && e->type == TR_JSON_OBJECT)
        return tr_json_string(e, "content");
    return NULL;
}

static int find_eos(struct prepare_tokenizer *pt, const struct prepare_opts *o,
                    const struct tr_json *config)
{
    struct tr_tokenizer *t = pt->tok[0];
    pt->eos = -1;
    if (o->eos && strcmp(o->eos, "none") == 0) {
        pt->eos_from = "--eos none";
        return 0;
    }
    if (o->eos) {
        pt->eos = tr_tokenizer_token_id(t, o->eos);
        if (pt->eos < 0)
            return tr_prepare_fail("--eos %s: %s has no such token; name one of its tokens "
                                   "(such as its end-of-text special token), or --eos none",
                                   o->eos, pt->path);
        pt->eos_text = strdup(o->eos);
        pt->eos_from = "--eos";
        return 0;
    }
    const char *text = config ? config_eos(config) : NULL;
    if (text) {
        pt->eos = tr_tokenizer_token_id(t, text);
        if (pt->eos < 0)
            return tr_prepare_fail("%s names eos_token \"%s\", which %s does not have; name "
                                   "the EOS with --eos TOKEN (or --eos none)",
                                   pt->config_path, text, pt->path);
        pt->eos_text = strdup(text); /* the config's JSON is freed after loading */
        pt->eos_from = "tokenizer_config.json";
        return 0;
    }
    static const char *const known[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        if ((pt->eos = tr_tokenizer_token_id(t, known[i])) >= 0) {
            pt->eos_text = strdup(known[i]);
            pt->eos_from = "the tokenizer's tokens";
            return 0;
        }
    }
    return tr_prepare_fail("%s has none of the end-of-text tokens <|endoftext|>, "
                           "<|end_of_text|>, </s>%s; name the token to put after each "
                           "document with --eos TOKEN, or --eos none to put none",
                           pt->path, pt->config_path ? "" : " and no tokenizer_config.json "
                                                            "beside it names one");
}

/* Bytes of text each id stands for, to count the text bytes of every
 * shard: what the id decodes to, except the post-processor's tokens and
 * the EOS, which stand for no text. */
static int token_lengths(struct prepare_tokenizer *pt)
{
    struct tr_tokenizer *t = pt->tok[0];
    pt->token_len = calloc(pt->vocab, 1);
    if (!pt->token_len)
        return tr_prepare_fail("out of memory");
    for (uint32_t id = 0; id < pt->vocab; id++) {
        int32_t one = (int32_t)id;
        char *out = NULL;
        size_t len = 0;
        tr_err err;
        if (tr_tokenizer_decode(t, &one, 1, &out, &len, &err) == TR_OK)
            pt->token_len[id] = (unsigned char)(len > 255 ? 255 : len);
        free(out);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    tr_err err;
    if (tr_tokenizer_encode_ex(t, "", 0, 1, &ids, &n, &err) == TR_OK)
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= 0 && (uint32_t)ids[i] < pt->vocab)
                pt->token_len[ids[i]] = 0;
    free(ids);
    if (pt->eos >= 0)
        pt->token_len[pt->eos] = 0;
    return 0;
}

struct parse_job {
    struct prepare_tokenizer *pt;
    int index, started;
    pthread_t thread;
};

/* Another worker's copy of the tokenizer, from the bytes the first parsed. */
static void *parse_copy(void *arg)
{
    struct parse_job *job = arg;
    tr_err err;
    job->pt->tok[job->index] = tr_tokenizer_parse((const char *)job->pt->file,
                                                  job->pt->file_size, job->pt->path, &err);
    return NULL;
}

/* --tokenizer's file (a model directory's tokenizer.json), read whole and hashed.  0 or -1. */
static int read_tokenizer_file(struct prepare_tokenizer *pt, const struct prepare_opts *o)
{
    struct stat st;
    if (stat(pt->path, &st) != 0)
        return tr_prepare_fail("cannot read the tokenizer %s: %s (--tokenizer takes byte, char "
                               "or the path of a tokenizer.json)", pt->path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        /* a model directory, as from_pretrained takes it: its tokenizer.json */
        size_t n = strlen(o->tokenizer);
        pt->owned_path = malloc(n + sizeof "/tokenizer.json");
        if (!pt->owned_path)
            return tr_prepare_fail("out of memory");
        snprintf(pt->owned_path, n + sizeof "/tokenizer.json", "%s%stokenizer.json",
                 o->tokenizer, n && o->tokenizer[n - 1] == '/' ? "" : "/");
        pt->path = pt->owned_path;
        if (stat(pt->path, &st) != 0)
            return tr_prepare_fail("%s is a directory without a tokenizer.json (%s); --tokenizer "
                                   "takes byte, char, a tokenizer.json or a model directory "
                                   "holding one", o->tokenizer, strerror(errno));
    }
    if (tr_prepare_read_input(pt->path, &pt->file, &pt->file_size) != 0)
        return -1;
    pt->hash = fnv1a(FNV_OFFSET, pt->file, pt->file_size);
    return 0;
}

/* tokenizer_config.json beside it: copied with it, and its eos_token (*config, parsed; NULL
 * when there is none).  0 or -1. */
static int read_tokenizer_config(struct prepare_tokenizer *pt, struct tr_json **config)
{
    struct stat st;
    const char *slash = strrchr(pt->path, '/');
    size_t dir_len = slash ? (size_t)(slash - pt->path) + 1 : 0;
    static const char config_name[] = "tokenizer_config.json";
    *config = NULL;
    pt->config_path = malloc(dir_len + sizeof config_name);
    if (!pt->config_path)
        return tr_prepare_fail("out of memory");
    memcpy(pt->config_path, pt->path, dir_len);
    memcpy(pt->config_path + dir_len, config_name, sizeof config_name);
    if (stat(pt->config_path, &st) == 0 && S_ISREG(st.st_mode)) {
        if (tr_prepare_read_input(pt->config_path, &pt->config, &pt->config_size) != 0)
            return -1;
        size_t at = 0;
        *config = tr_json_parse((const char *)pt->config, pt->config_size, &at);
        if (!*config || (*config)->type != TR_JSON_OBJECT) {
            tr_json_free(*config);
            *config = NULL;
            return tr_prepare_fail("%s is not a JSON object (byte %zu); fix it, or move it away "
                                   "from %s", pt->config_path, at, pt->path);
        }
    } else {
        free(pt->config_path);
        pt->config_path = NULL;
    }
    return 0;
}

/* One tokenizer per worker: the first copy here (its error is the one reported), the others
 * on threads, as a large vocabulary takes a while to parse; pt->workers is how many could be
 * made.  0 or -1. */
static int parse_copies(struct prepare_tokenizer *pt, int workers)
{
    pt->tok = calloc((size_t)workers, sizeof *pt->tok);
    struct parse_job *jobs = calloc((size_t)workers, sizeof *jobs);
    int rc = pt->tok && jobs ? 0 : tr_prepare_fail("out of memory");
    tr_err err;
    if (rc == 0 && !(pt->tok[0] = tr_tokenizer_parse((const char *)pt->file, pt->file_size,
                                                     pt->path, &err)))
        rc = tr_prepare_fail("cannot use the tokenizer %s: %s", pt->path, err.msg);
    if (rc == 0) {
        for (int i = 1; i < workers; i++) {
            jobs[i].pt = pt;
            jobs[i].index = i;
            jobs[i].started = pthread_create(&jobs[i].thread, NULL, parse_copy, &jobs[i]) == 0;
            if (!jobs[i].started)
                parse_copy(&jobs[i]);
        }
        for (int i = 1; i < workers; i++)
            if (jobs[i].started)
                pthread_join(jobs[i].thread, NULL);
        pt->workers = 1;
        for (int i = 1; i < workers && pt->tok[i]; i++)
            pt->workers = i + 1;
        for (int i = pt->workers; i < workers; i++) { /* out of memory: fewer workers */
            tr_tokenizer_free(pt->tok[i]);
            pt->tok[i] = NULL;
        }
    }
    free(jobs);
    return rc;
}

int tr_prepare_tokenizer_load(struct prepare_tokenizer *pt, const struct prepare_opts *o,
                              int workers)
{
    memset(pt, 0, sizeof *pt);
    pt->path = o->tokenizer;
    pt->eos = -1;
    struct tr_json *config = NULL;
    int rc = read_tokenizer_file(pt, o);
    if (rc == 0)
        rc = read_tokenizer_config(pt, &config);
    if (rc == 0)
        rc = parse_copies(pt, workers);
    if (rc == 0) {
        size_t vocab = tr_tokenizer_vocab_size(pt->tok[0]);
        pt->vocab = (uint32_t)vocab;
        rc = find_eos(pt, o, config);
    }
    if (rc == 0)
        rc = token_lengths(pt);
    tr_json_free(config);
    return rc;
}

void tr_prepare_tokenizer_free(struct prepare_tokenizer *pt)
{
    for (int i = 0; pt->tok && i < pt->workers; i++)
        tr_tokenizer_free(pt->tok[i]);
    free(pt->tok);
    free(pt->file);
    free(pt->config);
    free(pt->config_path);
    free(pt->token_len);
    free(pt->eos_text);
    free(pt->owned_path);
    memset(pt, 0, sizeof *pt);
}

/* ---- encoding in parallel ------------------------------------------------------ */

struct encoded {
    int32_t *ids;
    size_t n;
};

struct batch {
    struct prepare_tokenizer *pt;
    const struct docs *d;
    const size_t *doc;        /* the batch's document indices */
    size_t n;
    struct encoded *out;
    size_t next;              /* the next document to take (atomic) */
    int failed;               /* atomic: stop taking documents */
    pthread_mutex_t lock;     /* guards the first error */
    size_t err_at;            /* batch index of the failed document */
    tr_err err;
    struct prepare_progress *progress;
};

struct worker {
    struct batch *b;
    int index;
};

static void record_error(struct batch *b, size_t at, const tr_err *err)
{
    pthread_mutex_lock(&b->lock);
    /* the earliest failed document, whichever worker saw it first */
    if (!b->failed || at < b->err_at) {
        b->err_at = at;
        b->err = *err;
    }
    __atomic_store_n(&b->failed, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&b->lock);
}

static void *encode_worker(void *arg)
{
    struct worker *wk = arg;
    struct batch *b = wk->b;
    struct tr_tokenizer *t = b->pt->tok[wk->index];
    int32_t eos = b->pt->eos;
    for (;;) {
        if (__atomic_load_n(&b->failed, __ATOMIC_RELAXED))
            break;
        size_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (i >= b->n)
            break;
        const struct doc *doc = &b->d->v[b->doc[i]];
        struct encoded *e = &b->out[i];
        tr_err err;
        if (tr_tokenizer_encode_ex(t, (const char *)doc->text, doc->len, 1, &e->ids, &e->n,
                                   &err) != TR_OK) {
            record_error(b, i, &err);
            break;
        }
        if (eos >= 0 && !(e->n > 0 && e->ids[e->n - 1] == eos)) {
            int32_t *grown = realloc(e->ids, (e->n + 1) * sizeof *grown);
            if (!grown) {
                tr_fail(&err, "out of memory");
                record_error(b, i, &err);
                break;
            }
            e->ids = grown;
            e->ids[e->n++] = eos;
        }
        tr_prepare_progress_add(b->progress, doc->len);
        if (wk->index == 0)
            tr_prepare_progress_draw(b->progress, 0);
    }
    return NULL;
}

/* Put one document's ids with the text bytes each stands for: what it
 * decodes to, the last text token taking what is left so that the
 * document's tokens count exactly its bytes. */
static int put_doc(struct prepare_tokenizer *pt, const struct doc *doc, const struct encoded *e,
                   struct tr_shard_writer *w)
{
    size_t last = 0;
    for (size_t k = 0; k < e->n; k++)
        if (pt->token_len[e->ids[k]])
            last = k;
    uint64_t left = doc->len;
    for (size_t k = 0; k < e->n; k++) {
        if (tr_shard_writer_put(w, (uint32_t)e->ids[k], 1) != 0)
            return -1;
        uint64_t bytes = k == last ? left : pt->token_len[e->ids[k]] < left
                                                ? pt->token_len[e->ids[k]] : left;
        left -= bytes;
        tr_shard_writer_add_text_bytes(w, bytes);
    }
    return 0;
}

int tr_prepare_encode_docs(struct prepare_tokenizer *pt, const struct docs *d, size_t from,
                           size_t to, const char *const *inputs, struct tr_shard_writer *w,
                           struct prepare_progress *progress)
{
    size_t cap = BATCH_DOCS;
    size_t *doc = malloc(cap * sizeof *doc);
    struct encoded *out = calloc(cap, sizeof *out);
    pthread_t *threads = calloc((size_t)pt->workers, sizeof *threads);
    struct worker *wk = calloc((size_t)pt->workers, sizeof *wk);
    int rc = doc && out && threads && wk ? 0 : tr_prepare_fail("out of memory");
    size_t i = from;
    while (rc == 0 && i < to) {
        struct batch b = {.pt = pt, .d = d, .doc = doc, .out = out, .progress = progress};
        size_t bytes = 0;
        for (; i < to && b.n < cap && bytes < BATCH_BYTES; i++) {
            if (d->v[i].removed)
                continue;
            doc[b.n++] = i;
            bytes += d->v[i].len;
        }
        if (b.n == 0)
            break;
        pthread_mutex_init(&b.lock, NULL);
        int threads_run = pt->workers < (int)b.n ? pt->workers : (int)b.n;
        int started = 1;
        for (int k = 1; k < threads_run; k++) {
            wk[k] = (struct worker){&b, k};
            if (pthread_create(&threads[k], NULL, encode_worker, &wk[k]) != 0)
                break; /* the workers started so far do the rest */
            started++;
        }
        wk[0] = (struct worker){&b, 0};
        encode_worker(&wk[0]);
        for (int k = 1; k < started; k++)
            pthread_join(threads[k], NULL);
        pthread_mutex_destroy(&b.lock);
        if (b.failed) {
            const struct doc *bad = &d->v[doc[b.err_at]];
            rc = tr_prepare_fail("%s:%ld: cannot tokenize this document: %s%s", inputs[bad->input],
                                 bad->line, b.err.msg,
                                 strstr(b.err.msg, "UTF-8") ? " (convert the input to UTF-8, "
                                                              "e.g. with iconv)" : "");
        }
        for (size_t k = 0; k < b.n && rc == 0; k++)
            rc = put_doc(pt, &d->v[doc[k]], &out[k], w);
        for (size_t k = 0; k < b.n; k++) {
            free(out[k].ids);
            out[k] = (struct encoded){0};
        }
    }
    free(doc);
    free(out);
    free(threads);
    free(wk);
    return rc;
}
