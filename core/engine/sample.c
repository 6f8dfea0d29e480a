/* `trainrun sample`: text from a checkpoint of a language model (or from a
 * recipe's model = { from = DIR } weights), one token at a time through the
 * model's graph, planned once for forward only (top-k, temperature, a
 * seeded generator, so the same flags give the same text; temperature 0 is
 * greedy: the argmax, no draw).  Where the model and backend run windows
 * of rows (graph.h, tr_graph_forward_rows), the plan keeps every
 * attention's keys and values (a key/value cache): the prompt runs once,
 * then each token's forward computes its own row alone; otherwise, and with
 * --no-cache, each token re-runs the forward over the context.  It only
 * reads: a session in sample mode (no run directory, checkpoint plugin or
 * optimizer state), and the weights through tr_checkpoint_load_weights, so
 * a running run's checkpoints directory is left as it is.
 *
 * Text in and out goes through the tokenizer the model learnt: the run
 * directory's tokenizer.json (recorded at the run's start), else model =
 * { from = DIR }'s DIR/tokenizer.json, else the one the data reports (a
 * char table is one too).  The prompt is encoded with it (after its BOS,
 * except before a prompt the chat template rendered) and each sampled id is
 * printed as its bytes as it comes, up to an EOS: --eos's, else the chat
 * template's end of turn and the tokenizer's EOS.  --chat renders the prompt
 * as a user turn with the chat template of the tokenizer_config.json beside
 * the tokenizer, as apply_chat_template does (chat.h).  Without any
 * tokenizer a token is a byte, as for the byte tokenizer's runs.  --ids
 * gives and prints ids either way. */
#include "run.h"
#include "session.h"

#include "../config/hf_config.h"
#include "../util/json.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"
#include "../../kernels/host.h"

#include <trainrun/input.h>
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

/* Top-k sampling: logits below the k-th largest drop out.  sorted holds n
 * floats, allocated once for the whole generation. */
static void keep_top_k(float *logits, float *sorted, int n, int k)
{
    if (k <= 0 || k >= n)
        return;
    memcpy(sorted, logits, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_desc);
    float threshold = sorted[k - 1];
    for (int i = 0; i < n; i++)
        if (logits[i] < threshold)
            logits[i] = -INFINITY;
}

/* Greedy decoding (--temperature 0): the first of the largest logits among
 * the ids that may be sampled, exactly, with no softmax or draw (a
 * temperature near 0 would overflow or underflow its way to nearly the
 * same). */
static int argmax(const float *logits, int allowed)
{
    int best = 0;
    for (int k = 1; k < allowed; k++)
        if (logits[k] > logits[best])
            best = k;
    return best;
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

/* The text of file `name` beside the tokenizer (at most 64 MiB), newly allocated and
 * NUL-terminated, or NULL when there is none. */
static char *text_beside(const char *tok_path, const char *name, size_t *len)
{
    char *dir = tr_dirname(tok_path);
    char *path = tr_xasprintf("%s/%s", dir, name);
    free(dir);
    FILE *f = tr_input_fopen(path);
    free(path);
    *len = 0;
    if (!f)
        return NULL;
    char *text = NULL;
    size_t got;
    char buf[65536];
    while ((got = fread(buf, 1, sizeof buf, f)) > 0 && *len < ((size_t)64 << 20)) {
        text = tr_xrealloc(text, *len + got + 1);
        memcpy(text + *len, buf, got);
        *len += got;
        text[*len] = '\0';
    }
    fclose(f);
    return text;
}

/* The JSON object in file `name` beside the tokenizer, or NULL. */
static struct tr_json *json_beside(const char *tok_path, const char *name)
{
    size_t len;
    char *text = text_beside(tok_path, name, &len);
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
 * prompt starts a document (BOS, else EOS, which separates documents).  A
 * prompt already rendered with the chat template (it starts with the
 * template's BOS text or turn opener) or starting with the BOS gets none: as
 * apply_chat_template, which writes the template's text and adds no
 * post-processor tokens (else ChatML's <|im_start|> comes twice where the
 * post-processor's BOS is that token).  Text the tokenizer cannot encode (a
 * character a char table lacks) is refused rather than dropped.  NULL with
 * err set. */
static int32_t *encode_prompt(struct tr_tokenizer *tok, const struct tr_chat_template *ct,
                              const char *prompt, int32_t eos, int64_t vocab,
                              const char *tok_path, size_t *n, tr_err *err)
{
    int32_t *ids = NULL, bos = tr_tokenizer_bos_id(tok);
    if (ct->family != TR_CHAT_NONE &&
        (strncmp(prompt, ct->opener, strlen(ct->opener)) == 0 ||
         (ct->bos && *ct->bos && strncmp(prompt, ct->bos, strlen(ct->bos)) == 0)))
        bos = -1;
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
    if (count > 0 && ids[0] == bos)
        bos = -1;
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

/* --chat: the prompt as a user message (after --system's, else the template's
 * default system prompt) rendered with the chat template and its generation
 * prompt, as apply_chat_template(messages, add_generation_prompt=True,
 * tokenize=True) gives it; the rendered text in *text.  NULL with err set. */
static int32_t *chat_prompt(struct tr_tokenizer *tok, const struct tr_chat_template *ct,
                            const struct tr_sample_flags *fl, int32_t eos, int64_t vocab,
                            const char *tok_path, char **text, size_t *n, tr_err *err)
{
    if (ct->family == TR_CHAT_NONE) {
        tr_fail(err, "--chat renders the prompt with the model's chat template, but %s; "
                "write the turns into --prompt yourself, or drop --chat", ct->why);
        return NULL;
    }
    struct tr_chat_message m[2] = {{"system", fl->system}, {"user", fl->prompt}};
    size_t len;
    int sys = fl->system != NULL;
    if (tr_chat_render(ct, m + !sys, 1 + (size_t)sys, 1, text, &len, NULL, err) != TR_OK)
        return NULL;
    /* rendered, it starts with the template's own BOS or turn opener: no other BOS */
    return encode_prompt(tok, ct, *text, eos, vocab, tok_path, n, err);
}

/* What sampling holds: the checkpoint read, the config, the session. */
struct sampler {
    char *dir, *name, *ckpt;        /* the checkpoint, when one is named */
    struct tr_json *state;          /* its state.json */
    const char **overrides;
    const char *recipe;
    struct tr_config cfg;
    struct tr_session s;
    struct tr_tokenizer *tok;
    char *tok_path;
    struct tr_chat_template tmpl;   /* of the tokenizer_config.json beside it */
    int32_t eos;                    /* the tokenizer's: an empty prompt starts after it */
    int32_t stop[2];                /* the ids generation stops at */
    int n_stop;
    int T, V, allowed;              /* context, logits, ids that may be sampled */
    int64_t vocab;                  /* ids the embedding has rows for */
};

/* The recipe (--recipe, else the checkpoint's) loaded with the training
 * run's overrides, the command line's, then one sequence at a time. */
static int load_config(struct sampler *sp, const struct tr_sample_flags *fl, tr_err *err)
{
    struct tr_run_state st;
    if (fl->checkpoint) {
        if (tr_checkpoint_resolve(fl->checkpoint, &sp->dir, &sp->name, err) != TR_OK)
            return TR_ERROR;
        /* the recipe and overrides below come from state.json: only one
         * whose own checksum and fields hold (its blobs are verified when
         * the weights are read) */
        sp->ckpt = tr_xasprintf("%s/%s", sp->dir, sp->name);
        if (!(sp->state = tr_checkpoint_read_state(sp->ckpt, &st, err)))
            return TR_ERROR;
    }
    sp->recipe = fl->recipe ? fl->recipe : sp->state ? tr_json_string(sp->state, "recipe") : NULL;
    if (!sp->recipe)
        return tr_fail(err, "the checkpoint does not name its recipe; pass --recipe FILE");
    const struct tr_json *trained = sp->state ? tr_json_get(sp->state, "overrides") : NULL;
    size_t n_trained = trained && trained->type == TR_JSON_ARRAY ? trained->n : 0;
    sp->overrides = tr_xcalloc(n_trained + (size_t)fl->n_overrides + 2, sizeof *sp->overrides);
    int n_over = 0;
    for (size_t i = 0; i < n_trained; i++)
        if (trained->items[i]->type == TR_JSON_STRING)
            sp->overrides[n_over++] = trained->items[i]->string;
    for (int i = 0; i < fl->n_overrides; i++)
        sp->overrides[n_over++] = fl->overrides[i];
    sp->overrides[n_over++] = "train.micro_batch=1";
    sp->overrides[n_over++] = "train.batch=1";
    if (tr_config_load(&sp->cfg, sp->recipe, sp->overrides, n_over, err) != TR_OK)
        return TR_ERROR;
    if (!sp->ckpt && !tr_hf_from_dir(sp->cfg.recipe))
        return tr_fail(err, "%s: the model has no weights to sample from: name a checkpoint "
                       "(trainrun sample RUN_DIR) or load them with model = { from = DIR }",
                       sp->recipe);
    return TR_OK;
}

/* One process, a session in sample mode (no run directory, checkpoint
 * plugin or checkpointer, whose start tidies the checkpoints directory and
 * would make run_dir where sample runs), and the weights. */
static int open_model(struct sampler *sp, tr_err *err)
{
    sp->cfg.rank = (struct tr_rank_info){0, 1, 0, 1, NULL};
    if (tr_session_open(&sp->s, &sp->cfg, TR_SESSION_SAMPLE, err) != TR_OK)
        return TR_ERROR;
    struct tr_session *s = &sp->s;
    /* an adapter's checkpoint holds the adapter alone: its base first */
    int base_first = tr_session_base_first(s);
    if ((base_first || !sp->ckpt) && tr_session_load_pretrained(s, err) != TR_OK)
        return TR_ERROR;
    if (sp->ckpt) {
        const char *base = tr_json_string(sp->state, "base");
        if (tr_session_check_base(s, base, sp->ckpt, err) != TR_OK ||
            tr_checkpoint_load_weights(sp->ckpt, s->g, &s->be, s->g->params, err) != TR_OK)
            return TR_ERROR;
    }
    s->g->training = 0; /* generation is evaluation: no running statistics move */
    const struct tr_tensor *in = &s->g->tensors[s->g->inputs[0]];
    if (in->dtype != TR_I32 || s->g->logits < 0)
        return tr_fail(err, "sample needs a language model (token inputs and logits)");
    sp->T = (int)in->shape[1];
    const struct tr_tensor *lg = &s->g->tensors[s->g->logits];
    sp->V = (int)lg->shape[lg->ndim - 1];
    /* the embedding reads a row per id: an id past its table is no token */
    sp->vocab = s->vocab < (uint32_t)sp->V ? (int64_t)s->vocab : sp->V;
    return TR_OK;
}

/* The chat template of the tokenizer_config.json beside the tokenizer; one that
 * is no JSON is as none, with why saying so (only --chat needs it). */
static void read_template(struct sampler *sp)
{
    size_t len;
    char *config = text_beside(sp->tok_path, "tokenizer_config.json", &len);
    char *dir = tr_dirname(sp->tok_path);
    char *path = tr_xasprintf("%s/tokenizer_config.json", dir);
    tr_err err = {{0}};
    if (tr_chat_template_read(&sp->tmpl, config, len, config ? path : sp->tok_path, &err) != TR_OK)
        snprintf(sp->tmpl.why, sizeof sp->tmpl.why, "%s", err.msg);
    free(config);
    free(path);
    free(dir);
}

/* The ids generation stops at: --eos's alone (a token's text or an id), else
 * the chat template's end of turn (<|im_end|>, <|eot_id|>: where a chat
 * model's answer ends, whatever eos_token says) and the tokenizer's EOS (where
 * prepare ended documents), unless that is the template's turn opener, which
 * some configs name as eos_token. */
static int find_stops(struct sampler *sp, const struct tr_sample_flags *fl, tr_err *err)
{
    sp->n_stop = 0;
    if (fl->eos) {
        const char *e = fl->eos;
        char *end;
        errno = 0;
        long long id = *e >= '0' && *e <= '9' ? strtoll(e, &end, 10) : -1;
        if (id >= 0 && (errno || *end))
            id = -1;
        if (id < 0 && sp->tok)
            id = tr_tokenizer_token_id(sp->tok, e);
        if (id < 0 && sp->tok)
            return tr_fail(err, "--eos '%.60s': %s has no such token; give a token of its "
                           "vocabulary (e.g. %s) or its id", e, sp->tok_path,
                           sp->tmpl.family ? sp->tmpl.end_of_turn : "<|endoftext|>");
        if (id < 0)
            return tr_fail(err, "--eos '%.60s': without a tokenizer a token is a byte or an "
                           "id: give the id, e.g. --eos 10", e);
        if (id >= sp->allowed)
            return tr_fail(err, "--eos %lld is not an id the model samples (below %d)", id,
                           sp->allowed);
        sp->stop[sp->n_stop++] = (int32_t)id;
        return TR_OK;
    }
    int32_t eot = -1, opener = -1;
    if (sp->tok && sp->tmpl.family) {
        eot = tr_tokenizer_token_id(sp->tok, sp->tmpl.end_of_turn);
        opener = tr_tokenizer_token_id(sp->tok, sp->tmpl.opener);
    }
    if (eot >= 0 && eot < sp->allowed)
        sp->stop[sp->n_stop++] = eot;
    if (sp->eos >= 0 && sp->eos != eot && sp->eos != opener)
        sp->stop[sp->n_stop++] = sp->eos;
    return TR_OK;
}

/* The model's tokenizer, its chat template and the ids to stop at; without a
 * tokenizer a token is a byte. */
static int open_tokenizer(struct sampler *sp, const struct tr_sample_flags *fl, tr_err *err)
{
    sp->tok_path = find_tokenizer(sp->dir, &sp->cfg, &sp->s.data.info);
    if (sp->tok_path && !(sp->tok = tr_tokenizer_load(sp->tok_path, err))) {
        tr_err_prefix(err, "the model's tokenizer");
        return TR_ERROR;
    }
    sp->eos = sp->tok ? find_eos(sp->tok, sp->tok_path) : -1;
    if (sp->tok)
        read_template(sp);
    else
        snprintf(sp->tmpl.why, sizeof sp->tmpl.why, "the model has no tokenizer (none is in "
                 "the run directory, in model.from's directory or beside the data)");
    /* ids past the tokenizer's are no text (a vocabulary padded to a round
     * size): never sampled */
    sp->allowed = sp->tok && tr_tokenizer_vocab_size(sp->tok) < (size_t)sp->V
                      ? (int)tr_tokenizer_vocab_size(sp->tok) : sp->V;
    if (find_stops(sp, fl, err) != TR_OK)
        return TR_ERROR;
    if (sp->tok) {
        char eos_text[400] = "none";
        size_t at = 0;
        for (int i = 0; i < sp->n_stop; i++) {
            char *bytes = NULL;
            size_t blen = 0;
            tr_err ignored = {{0}};
            int32_t id = sp->stop[i];
            if (tr_tokenizer_decode(sp->tok, &id, 1, &bytes, &blen, &ignored) != TR_OK)
                bytes = NULL;
            const char *why = fl->eos ? " (--eos)"
                              : sp->tmpl.family && id == tr_tokenizer_token_id(
                                    sp->tok, sp->tmpl.end_of_turn)
                                  ? " (the chat template's end of turn)" : "";
            at += (size_t)snprintf(eos_text + at, sizeof eos_text - at, "%s%d %.40s%s",
                                   i ? ", " : "", (int)id, bytes ? bytes : "?", why);
            if (at >= sizeof eos_text)
                at = sizeof eos_text - 1;
            free(bytes);
        }
        tr_log(TR_LOG_INFO, "sample", "tokenizer %s (%zu ids; EOS: %s%s)", sp->tok_path,
               tr_tokenizer_vocab_size(sp->tok), eos_text,
               sp->n_stop && fl->ignore_eos ? ", ignored" : "");
    } else if (!fl->ids && sp->V > 256) {
        return tr_fail(err, "%s: the model predicts %d token ids, more than the 256 bytes sample "
                       "prints as text; pass --ids to give the prompt and get the text as token "
                       "ids, or put the tokenizer.json that made the data in the run directory "
                       "(none is in it, in model.from's directory or beside the data)",
                       sp->recipe, sp->V);
    }
    return TR_OK;
}

/* One id drawn from probs[0..V) by the seeded generator. */
static int draw(const float *probs, int V, uint64_t *rng)
{
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    double u = (double)(*rng >> 11) * 0x1.0p-53, acc = 0;
    for (int k = 0; k < V; k++) {
        acc += probs[k];
        if (u < acc)
            return k;
    }
    return V - 1;
}

/* The prompt's tokens, then up to fl->tokens more, each printed as it
 * comes; stops at an EOS (sp->stop) unless --ignore-eos.  The tokens sampled
 * up to the EOS, 0 when none came. */
static size_t generate(struct sampler *sp, const struct tr_sample_flags *fl, int32_t *text,
                       size_t plen)
{
    struct tr_session *s = &sp->s;
    struct tr_graph *g = s->g;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]], *lg = &g->tensors[g->logits];
    int T = sp->T, V = sp->V;
    size_t total = plen + (size_t)fl->tokens, stopped = 0;
    int32_t *ctx = tr_xcalloc((size_t)T, sizeof *ctx);
    float *logits = tr_xcalloc((size_t)V, sizeof *logits), *probs = tr_xcalloc((size_t)V, sizeof *probs);
    float *sorted = tr_xcalloc((size_t)V, sizeof *sorted); /* top-k's, once for every token */
    uint64_t rng = fl->seed * 0x9e3779b97f4a7c15ULL + 1;
    /* with the key/value cache, rows [0, cached) of every attention's inputs
     * hold text[0 .. cached)'s: each forward computes the new rows alone (the
     * prompt's at once, then a token's) until the context is full; past it,
     * as without the cache, the whole window of the last T tokens */
    int cache = s->kv_cache > 0 && !fl->no_cache;
    size_t cached = 0, made = 0;
    double t0 = tr_now(), t_first = 0;
    for (size_t n = plen; n < total; n++) {
        size_t start = n > (size_t)T ? n - (size_t)T : 0;
        int len = (int)(n - start);
        if (cache && n > 0 && n <= (size_t)T) {
            tr_be_upload(&s->be, (int32_t *)in->data + cached, text + cached,
                         (n - cached) * sizeof(int32_t));
            tr_graph_forward_rows(g, &s->be, (int)cached, (int)n);
            cached = n;
        } else {
            for (int t = 0; t < T; t++)
                ctx[t] = t < len ? text[start + (size_t)t] : 0;
            tr_be_upload(&s->be, in->data, ctx, (size_t)T * sizeof(int32_t));
            tr_graph_forward(g, &s->be);
        }
        int at = len > 0 ? len - 1 : 0;
        tr_be_download(&s->be, logits, (float *)lg->data + (size_t)at * (size_t)V,
                       (size_t)V * sizeof(float));
        int pick;
        if (fl->temperature == 0) {
            pick = argmax(logits, sp->allowed);
        } else {
            for (int k = sp->allowed; k < V; k++)
                logits[k] = -INFINITY;
            keep_top_k(logits, sorted, V, fl->top_k);
            tr_cpu_softmax(probs, logits, V, (float)fl->temperature);
            pick = draw(probs, V, &rng);
        }
        text[n] = pick;
        if (n == plen)
            t_first = tr_now() - t0; /* the prompt's forward and the first token */
        made++;
        int stop = 0;
        for (int i = 0; i < sp->n_stop && !fl->ignore_eos; i++)
            stop |= pick == sp->stop[i];
        if (!stop || fl->ids)
            put_token(fl, sp->tok, text, n);
        fflush(stdout);
        if (stop) {
            stopped = n + 1 - plen;
            break;
        }
    }
    double seconds = tr_now() - t0;
    if (made > 1)
        tr_log(TR_LOG_INFO, "sample", "%zu tokens in %.3f s: the prompt's %zu and the first in "
               "%.3f s, then %.1f tokens/s", made, seconds, plen, t_first,
               (double)(made - 1) / (seconds - t_first));
    free(ctx);
    free(logits);
    free(probs);
    free(sorted);
    return stopped;
}

int tr_sample(const struct tr_sample_flags *fl)
{
    tr_err err = {{0}};
    struct sampler sp;
    memset(&sp, 0, sizeof sp);
    int code = TR_EXIT_ERROR;
    if (load_config(&sp, fl, &err) != TR_OK || open_model(&sp, &err) != TR_OK ||
        open_tokenizer(&sp, fl, &err) != TR_OK)
        goto fail;
    size_t plen = 0;
    char *rendered = NULL;
    int32_t *prompt = NULL;
    if (fl->chat && !sp.tok)
        tr_fail(&err, "--chat renders the prompt with the model's chat template, but %s",
                sp.tmpl.why);
    else if (fl->chat)
        prompt = chat_prompt(sp.tok, &sp.tmpl, fl, sp.eos, sp.vocab, sp.tok_path, &rendered,
                             &plen, &err);
    else if (sp.tok && !fl->ids)
        prompt = encode_prompt(sp.tok, &sp.tmpl, fl->prompt, sp.eos, sp.vocab, sp.tok_path,
                               &plen, &err);
    else
        prompt = prompt_tokens(fl, sp.vocab, &plen, &err);
    if (!prompt) {
        free(rendered);
        goto fail;
    }
    tr_log(TR_LOG_INFO, "sample", "prompt: %zu tokens%s; %s", plen,
           fl->chat ? ", rendered with the chat template" : "",
           fl->no_cache ? "no key/value cache (--no-cache): each token re-runs the context"
           : sp.s.kv_cache ? "key/value cache"
                           : "no key/value cache (the model or device cannot run windows of "
                             "rows): each token re-runs the context");
    if (sp.s.kv_cache && !fl->no_cache)
        tr_log(TR_LOG_INFO, "sample", "key/value cache: %.1f MiB for %d positions",
               (double)sp.s.kv_cache / (1 << 20), sp.T);
    int32_t *text = tr_xcalloc(plen + (size_t)fl->tokens + 1, sizeof *text);
    memcpy(text, prompt, plen * sizeof *text);
    free(prompt);
    if (fl->ids || !sp.tok)
        for (size_t n = 0; n < plen; n++)
            put_token(fl, NULL, text, n);
    else
        fputs(rendered ? rendered : fl->prompt, stdout); /* as given: the BOS is no text */
    free(rendered);
    size_t stopped = generate(&sp, fl, text, plen);
    fputc('\n', stdout);
    if (stopped)
        tr_log(TR_LOG_INFO, "sample", "stopped at the EOS token %d after %zu tokens "
               "(--ignore-eos samples on)", (int)text[plen + stopped - 1], stopped);
    free(text);
    code = TR_EXIT_OK;
    goto out;
fail:
    tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    tr_session_close(&sp.s);
    if (sp.cfg.recipe)
        tr_config_free(&sp.cfg);
    free(sp.overrides);
    tr_json_free(sp.state);
    tr_tokenizer_free(sp.tok);
    tr_chat_template_free(&sp.tmpl);
    free(sp.tok_path);
    free(sp.ckpt);
    free(sp.dir);
    free(sp.name);
    return code;
}
