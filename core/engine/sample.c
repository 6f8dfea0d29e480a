/* `trainrun sample`: text from a checkpoint of a language model (or from a
 * recipe's model = { from = DIR } weights), one token at a time through the
 * training graph (top-k, temperature, a seeded generator, so the same flags
 * give the same text).  It only reads: the run's setup in the read-only mode
 * `trainrun eval` uses, and the weights through tr_checkpoint_load_weights,
 * so a running run's checkpoints directory is left as it is.
 *
 * Text in and out goes through the tokenizer the model learnt: the run
 * directory's tokenizer.json (recorded at the run's start), else model =
 * { from = DIR }'s DIR/tokenizer.json, else the one the data reports (a
 * char table is one too).  The prompt is encoded with it (after its BOS)
 * and each sampled id is printed as its bytes as it comes, up to the
 * tokenizer's EOS.  Without any tokenizer a token is a byte, as for the
 * byte tokenizer's runs.  --ids gives and prints ids either way. */
#include "run.h"
#include "run_internal.h"

#include "../config/hf_config.h"
#include "../util/json.h"
#include "../tokenizer/tokenizer.h"
#include "../../kernels/host.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int compare_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Top-k sampling: logits below the k-th largest drop out. */
static void keep_top_k(float *logits, int n, int k)
{
    if (k <= 0 || k >= n)
        return;
    float *sorted = tr_xcalloc((size_t)n, sizeof *sorted);
    memcpy(sorted, logits, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_desc);
    float threshold = sorted[k - 1];
    for (int i = 0; i < n; i++)
        if (logits[i] < threshold)
            logits[i] = -INFINITY;
    free(sorted);
}

/* The prompt as token ids: its bytes, or with --ids the decimal ids it
 * lists (separated by spaces or commas).  Each must be below vocab: the
 * embedding would read a row past its table.  NULL with err set. */
static int32_t *prompt_tokens(const struct tr_sample_flags *fl, int64_t vocab, size_t *n,
                              tr_err *err)
{
    const char *p = fl->prompt;
    int32_t *ids = tr_xcalloc(strlen(p) + 1, sizeof *ids);
    *n = 0;
    while (*p) {
        long long id;
        if (!fl->ids) {
            id = (unsigned char)*p++;
        } else {
            if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
                p++;
                continue;
            }
            char *end;
            errno = 0;
            id = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
            if (id < 0 || errno || (*end && !strchr(" ,\t\n", *end))) {
                free(ids);
                tr_fail(err, "--prompt: '%.40s' is not a token id: with --ids the prompt lists "
                        "token ids, e.g. --prompt \"1 2 3\"", p);
                return NULL;
            }
            p = end;
        }
        if (id >= vocab) {
            free(ids);
            if (fl->ids)
                tr_fail(err, "--prompt: token id %lld is not in the model's vocabulary of %lld",
                        id, (long long)vocab);
            else
                tr_fail(err, "--prompt: byte %lld (%s%c%s) is not in the model's vocabulary of "
                        "%lld tokens (the prompt's bytes are its token ids): use bytes below "
                        "%lld, or token ids with --ids", id, id >= 32 && id < 127 ? "'" : "",
                        id >= 32 && id < 127 ? (int)id : '?', id >= 32 && id < 127 ? "'" : "",
                        (long long)vocab, (long long)vocab);
            return NULL;
        }
        ids[(*n)++] = (int32_t)id;
    }
    if (fl->ids && *n == 0) {
        free(ids);
        tr_fail(err, "--ids needs a --prompt of one token id at least, e.g. --prompt \"1\"");
        return NULL;
    }
    return ids;
}

/* Token text[n] to stdout: with --ids its id after a space, else its text:
 * what it adds to the tokenizer's decode of text[0..n) (a byte-level token's
 * bytes; a SentencePiece-style token's "▁" as a space, except where the
 * decoder strips it; a token may end inside a UTF-8 character and the next
 * one's bytes complete it on the terminal), or the id as a byte. */
static void put_token(const struct tr_sample_flags *fl, const struct tr_tokenizer *tok,
                      const int32_t *text, size_t n)
{
    int32_t id = text[n];
    if (fl->ids) {
        printf("%s%d", n ? " " : "", (int)id);
    } else if (tok) {
        char *bytes = NULL;
        size_t len = 0;
        tr_err ignored = {{0}};
        if (tr_tokenizer_decode_next(tok, text, n + 1, &bytes, &len, &ignored) == TR_OK)
            fwrite(bytes, 1, len, stdout);
        free(bytes);
    } else {
        fputc(id, stdout);
    }
}

/* The tokenizer of the weights sampled: the run directory's (beside the
 * checkpoints directory, or the recipe's run_dir), model.from's, or the
 * data's; NULL when there is none.  Newly allocated. */
static char *find_tokenizer(const char *ckpt_dir, const struct tr_config *cfg,
                            const struct tr_data_info *data)
{
    char *candidates[3] = {NULL, NULL, NULL};
    if (ckpt_dir) {
        char *run_dir = tr_dirname(ckpt_dir);
        candidates[0] = tr_xasprintf("%s/tokenizer.json", run_dir);
        candidates[1] = tr_xasprintf("%s/tokenizer.json", cfg->run_dir);
        free(run_dir);
    }
    const char *from = tr_hf_from_dir(cfg->recipe);
    if (from)
        candidates[2] = tr_xasprintf("%s/tokenizer.json", from);
    char *found = NULL;
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (!found && candidates[i] && stat(candidates[i], &st) == 0 && S_ISREG(st.st_mode))
            found = candidates[i];
        else
            free(candidates[i]);
    }
    if (!found && data->tokenizer && *data->tokenizer)
        found = tr_xstrdup(data->tokenizer);
    return found;
}

/* The JSON object in file `name` beside the tokenizer, or NULL. */
static struct tr_json *json_beside(const char *tok_path, const char *name)
{
    char *dir = tr_dirname(tok_path);
    char *path = tr_xasprintf("%s/%s", dir, name);
    free(dir);
    FILE *f = fopen(path, "rb");
    free(path);
    if (!f)
        return NULL;
    char *text = NULL;
    size_t len = 0, got;
    char buf[65536];
    while ((got = fread(buf, 1, sizeof buf, f)) > 0 && len < ((size_t)64 << 20)) {
        text = tr_xrealloc(text, len + got + 1);
        memcpy(text + len, buf, got);
        len += got;
    }
    fclose(f);
    struct tr_json *j = text ? tr_json_parse(text, len, NULL) : NULL;
    free(text);
    if (j && j->type != TR_JSON_OBJECT) {
        tr_json_free(j);
        j = NULL;
    }
    return j;
}

/* A JSON number that is a token id of tok, or -1. */
static int32_t json_id(const struct tr_tokenizer *tok, const struct tr_json *v)
{
    if (!v || v->type != TR_JSON_NUMBER || v->number < 0 ||
        v->number >= (double)tr_tokenizer_vocab_size(tok) || v->number != (double)(int32_t)v->number)
        return -1;
    return (int32_t)v->number;
}

/* The EOS recorded with the tokenizer: the run's tokenizer.origin.json
 * (from the prepare.json of its data), or the prepare.json of a data
 * directory; else the eos_token of its tokenizer_config.json (a string, or
 * {"content": ...}); -1 when none says. */
static int32_t recorded_eos(const struct tr_tokenizer *tok, const char *tok_path)
{
    struct tr_json *origin = json_beside(tok_path, "tokenizer.origin.json");
    int32_t id = origin ? json_id(tok, tr_json_get(origin, "eos")) : -1;
    tr_json_free(origin);
    struct tr_json *prepared = id < 0 ? json_beside(tok_path, "prepare.json") : NULL;
    const struct tr_json *pt = prepared ? tr_json_get(prepared, "tokenizer") : NULL;
    if (pt && pt->type == TR_JSON_OBJECT)
        id = json_id(tok, tr_json_get(pt, "eos"));
    tr_json_free(prepared);
    struct tr_json *config = id < 0 ? json_beside(tok_path, "tokenizer_config.json") : NULL;
    const struct tr_json *e = config ? tr_json_get(config, "eos_token") : NULL;
    const char *name = !e ? NULL
                       : e->type == TR_JSON_STRING ? e->string
                       : e->type == TR_JSON_OBJECT ? tr_json_string(e, "content") : NULL;
    if (name)
        id = tr_tokenizer_token_id(tok, name);
    tr_json_free(config);
    return id;
}

/* The id generation stops at, the one `prepare` put after each document:
 * the EOS recorded with the tokenizer (recorded_eos), else the
 * post-processor's EOS, else the end-of-text token of the usual
 * vocabularies; -1 when there is none. */
static int32_t find_eos(const struct tr_tokenizer *tok, const char *tok_path)
{
    int32_t id = recorded_eos(tok, tok_path);
    if (id < 0)
        id = tr_tokenizer_eos_id(tok);
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
    for (size_t i = 0; id < 0 && i < TR_ARRAY_LEN(names); i++)
        id = tr_tokenizer_token_id(tok, names[i]);
    return id;
}

/* The prompt through the tokenizer, after its BOS when it has one; an empty
 * prompt starts a document (BOS, else EOS, which separates documents).
 * Text the tokenizer cannot encode (a character a char table lacks) is
 * refused rather than dropped.  NULL with err set. */
static int32_t *encode_prompt(struct tr_tokenizer *tok, const char *prompt, int32_t eos,
                              int64_t vocab, const char *tok_path, size_t *n, tr_err *err)
{
    int32_t *ids = NULL, bos = tr_tokenizer_bos_id(tok);
    size_t len = strlen(prompt), count = 0;
    /* Refused only when a character cannot be encoded (the unknown token, or dropped):
     * not when decode does not give the prompt back byte for byte, as after an NFC
     * normalizer or Llama 2's decoder, which strips the space its normalizer prepends. */
    size_t at = len;
    if (tr_tokenizer_unknown_at(tok, prompt, len, &at, err) != TR_OK)
        return NULL;
    if (at < len) {
        /* the character at `at` (encode took the prompt, so it is valid UTF-8) */
        const unsigned char *u = (const unsigned char *)prompt + at;
        size_t k = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
        uint32_t cp = k == 1 ? u[0] : u[0] & (0x7F >> k);
        for (size_t j = 1; j < k && at + j < len; j++)
            cp = cp << 6 | (u[j] & 0x3F);
        int show = cp >= 32 && cp != 127 && !(cp >= 0x80 && cp < 0xA0);
        tr_fail(err, "--prompt: the character %s%.*s%sU+%04X at byte %zu has no token in %s (neither "
                "in its vocabulary nor as byte fallback): write the prompt with characters the "
                "model's data had", show ? "'" : "", show ? (int)k : 0, prompt + at,
                show ? "' " : "", (unsigned)cp, at, tok_path);
        return NULL;
    }
    if (tr_tokenizer_encode(tok, prompt, len, &ids, &count, err) != TR_OK)
        return NULL;
    int32_t start = bos >= 0 ? bos : count == 0 ? eos : -1;
    if (count == 0 && start < 0) {
        free(ids);
        tr_fail(err, "--prompt is empty and %s has no BOS or EOS token to start from: give a "
                "prompt", tok_path);
        return NULL;
    }
    if (start >= 0) {
        ids = tr_xrealloc(ids, (count + 1) * sizeof *ids);
        memmove(ids + 1, ids, count * sizeof *ids);
        ids[0] = start;
        count++;
    }
    for (size_t i = 0; i < count; i++)
        if (ids[i] >= vocab) {
            tr_fail(err, "--prompt: its token %d (from %s) is not in the model's vocabulary of "
                    "%lld: was the model trained with another tokenizer?", (int)ids[i], tok_path,
                    (long long)vocab);
            free(ids);
            return NULL;
        }
    *n = count;
    return ids;
}

int tr_sample(const struct tr_sample_flags *fl)
{
    tr_err err = {{0}};
    char *dir = NULL, *name = NULL, *ckpt = NULL, *tok_path = NULL;
    struct tr_tokenizer *tok = NULL;
    struct tr_json *state = NULL;
    struct tr_run_state st;
    const char **overrides = NULL;
    struct tr_config cfg;
    memset(&cfg, 0, sizeof cfg);
    struct run run, *r = &run;
    memset(r, 0, sizeof *r);
    int code = TR_EXIT_ERROR;
    if (fl->checkpoint) {
        if (tr_checkpoint_resolve(fl->checkpoint, &dir, &name, &err) != TR_OK)
            goto fail;
        /* the recipe and overrides below come from state.json: only one
         * whose own checksum and fields hold (its blobs are verified when
         * the weights are read) */
        ckpt = tr_xasprintf("%s/%s", dir, name);
        if (!(state = tr_checkpoint_read_state(ckpt, &st, &err)))
            goto fail;
    }
    const char *recipe = fl->recipe ? fl->recipe : state ? tr_json_string(state, "recipe") : NULL;
    if (!recipe) {
        tr_fail(&err, "the checkpoint does not name its recipe; pass --recipe FILE");
        goto fail;
    }
    /* the training run's overrides, the command line's, then one sequence
     * at a time */
    const struct tr_json *trained = state ? tr_json_get(state, "overrides") : NULL;
    size_t n_trained = trained && trained->type == TR_JSON_ARRAY ? trained->n : 0;
    overrides = tr_xcalloc(n_trained + (size_t)fl->n_overrides + 2, sizeof *overrides);
    int n_over = 0;
    for (size_t i = 0; i < n_trained; i++)
        if (trained->items[i]->type == TR_JSON_STRING)
            overrides[n_over++] = trained->items[i]->string;
    for (int i = 0; i < fl->n_overrides; i++)
        overrides[n_over++] = fl->overrides[i];
    overrides[n_over++] = "train.micro_batch=1";
    overrides[n_over++] = "train.batch=1";
    if (tr_config_load(&cfg, recipe, overrides, n_over, &err) != TR_OK)
        goto fail;
    if (!ckpt && !tr_hf_from_dir(cfg.recipe)) {
        tr_fail(&err, "%s: the model has no weights to sample from: name a checkpoint (trainrun "
                "sample RUN_DIR) or load them with model = { from = DIR }", recipe);
        goto fail;
    }
    /* one process, and the run's setup in its read-only mode: no run
     * directory, checkpoint plugin or checkpointer, whose start tidies the
     * checkpoints directory (and would make run_dir where sample runs) */
    cfg.rank = (struct tr_rank_info){0, 1, 0, 1, NULL};
    r->cfg = &cfg;
    r->eval_only = 1;
    if (tr_run_setup(r, &err) != TR_OK)
        goto fail;
    int loaded = ckpt ? tr_checkpoint_load_weights(ckpt, r->g, &r->be, r->g->params, &err)
                      : tr_run_load_pretrained(r, &err);
    if (loaded != TR_OK)
        goto fail;
    struct tr_graph *g = r->g;
    g->training = 0; /* generation is evaluation: no running statistics move */
    struct tr_tensor *in = &g->tensors[g->inputs[0]];
    if (in->dtype != TR_I32 || g->logits < 0) {
        tr_fail(&err, "sample needs a language model (token inputs and logits)");
        goto fail;
    }
    int T = (int)in->shape[1];
    const struct tr_tensor *lg = &g->tensors[g->logits];
    int V = (int)lg->shape[lg->ndim - 1];
    /* the embedding reads a row per id: an id past its table is no token */
    int64_t vocab = r->vocab < (uint32_t)V ? (int64_t)r->vocab : V;
    tok_path = find_tokenizer(dir, &cfg, &r->data.info);
    if (tok_path && !(tok = tr_tokenizer_load(tok_path, &err))) {
        tr_err_prefix(&err, "the model's tokenizer");
        goto fail;
    }
    int32_t eos = tok ? find_eos(tok, tok_path) : -1;
    int stop_at = fl->ignore_eos ? -1 : eos;
    /* ids past the tokenizer's are no text (a vocabulary padded to a round
     * size): never sampled */
    int allowed = tok && tr_tokenizer_vocab_size(tok) < (size_t)V ? (int)tr_tokenizer_vocab_size(tok) : V;
    if (tok) {
        char eos_text[64] = "none";
        char *bytes = NULL;
        size_t blen = 0;
        tr_err ignored = {{0}};
        if (eos >= 0 && tr_tokenizer_decode(tok, &eos, 1, &bytes, &blen, &ignored) == TR_OK)
            snprintf(eos_text, sizeof eos_text, "%d %.40s", (int)eos, bytes);
        free(bytes);
        tr_log(TR_LOG_INFO, "sample", "tokenizer %s (%zu ids; EOS: %s%s)", tok_path,
               tr_tokenizer_vocab_size(tok), eos_text,
               eos >= 0 && fl->ignore_eos ? ", ignored" : "");
    } else if (!fl->ids && V > 256) {
        tr_fail(&err, "%s: the model predicts %d token ids, more than the 256 bytes sample "
                "prints as text; pass --ids to give the prompt and get the text as token ids, "
                "or put the tokenizer.json that made the data in the run directory (none is in "
                "it, in model.from's directory or beside the data)", recipe, V);
        goto fail;
    }
    size_t plen = 0;
    int32_t *prompt = tok && !fl->ids ? encode_prompt(tok, fl->prompt, eos, vocab, tok_path, &plen, &err)
                                      : prompt_tokens(fl, vocab, &plen, &err);
    if (!prompt)
        goto fail;
    size_t total = plen + (size_t)fl->tokens;
    int32_t *text = tr_xcalloc(total + 1, sizeof *text);
    memcpy(text, prompt, plen * sizeof *text);
    free(prompt);
    int32_t *ctx = tr_xcalloc((size_t)T, sizeof *ctx);
    float *logits = tr_xcalloc((size_t)V, sizeof *logits), *probs = tr_xcalloc((size_t)V, sizeof *probs);
    uint64_t rng = fl->seed * 0x9e3779b97f4a7c15ULL + 1;
    if (fl->ids || !tok)
        for (size_t n = 0; n < plen; n++)
            put_token(fl, NULL, text, n);
    else
        fputs(fl->prompt, stdout); /* as given: the BOS is no text */
    size_t stopped = 0;
    for (size_t n = plen; n < total; n++) {
        size_t start = n > (size_t)T ? n - (size_t)T : 0;
        int len = (int)(n - start);
        for (int t = 0; t < T; t++)
            ctx[t] = t < len ? text[start + (size_t)t] : 0;
        r->be.iface->upload(r->be.context, in->data, ctx, (size_t)T * sizeof(int32_t));
        tr_graph_forward(g, &r->be);
        int at = len > 0 ? len - 1 : 0;
        r->be.iface->download(r->be.context, logits, (float *)lg->data + (size_t)at * (size_t)V,
                              (size_t)V * sizeof(float));
        for (int k = allowed; k < V; k++)
            logits[k] = -INFINITY;
        keep_top_k(logits, V, fl->top_k);
        tr_cpu_softmax(probs, logits, V, (float)fl->temperature);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        double u = (double)(rng >> 11) * 0x1.0p-53, acc = 0;
        int pick = V - 1;
        for (int k = 0; k < V; k++) {
            acc += probs[k];
            if (u < acc) {
                pick = k;
                break;
            }
        }
        text[n] = pick;
        if (pick != stop_at || fl->ids)
            put_token(fl, tok, text, n);
        fflush(stdout);
        if (pick == stop_at) {
            stopped = n + 1 - plen;
            break;
        }
    }
    fputc('\n', stdout);
    if (stopped)
        tr_log(TR_LOG_INFO, "sample", "stopped at the EOS token after %zu tokens (--ignore-eos "
               "samples on)", stopped);
    free(ctx);
    free(logits);
    free(probs);
    free(text);
    code = TR_EXIT_OK;
    goto out;
fail:
    tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    tr_run_teardown(r);
    if (cfg.recipe)
        tr_config_free(&cfg);
    free(overrides);
    tr_json_free(state);
    tr_tokenizer_free(tok);
    free(tok_path);
    free(ckpt);
    free(dir);
    free(name);
    return code;
}
