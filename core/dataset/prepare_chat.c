/*
 * `trainrun prepare --format instruct` (see prepare_internal.h): instruction
 * data, JSONL records (plain, .gz or .zst) of either kind
 *
 *   {"prompt": "...", "response": "..."}
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 *
 * become token shards with a loss mask (TRTOKENS version 2), so training
 * predicts only what the model should learn to say: the response and its
 * end token, or each assistant turn's content and its end token.  The rest
 * (prompt, system and user turns, the template's headers) is read as
 * context and never predicted.
 *
 * A prompt/response record is [BOS when the tokenizer's post-processor adds
 * one] prompt response EOS, prompt and response encoded on their own.
 * Messages are what transformers' apply_chat_template(messages, tokenize=True)
 * gives with the chat template of the tokenizer_config.json beside the
 * tokenizer.json: the template's text (ChatML's default system prompt when
 * the first message is not a system one, Llama 3's bos_token and trimmed
 * contents) tokenized whole, and no post-processor BOS on top (chat.h).
 *
 * A token is trained on when it holds a byte of an assistant message's
 * content or end-of-turn token.  Records are not deduplicated (instruction
 * sets are curated); validation is whole records from the end, as for text.
 */
#include "dataset.h"

#include "prepare_internal.h"

#include "../util/json.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"
#include "../util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every record's tokens and mask bits, one after another. */
struct records {
    int32_t *ids;
    unsigned char *trained; /* one byte per token: 1 when it is a target */
    size_t n, cap;
    size_t *start;          /* record r is tokens [start[r], start[r + 1]) */
    uint64_t *text_bytes;   /* bytes of text record r encodes */
    size_t count, count_cap;
};

struct chat {
    const struct prepare_opts *o;
    struct prepare_tokenizer pt;
    struct tr_tokenizer *tok;
    int32_t bos;            /* the post-processor's BOS, or -1: prompt/response records' */
    struct tr_chat_template tmpl;
    struct records rec;
    size_t prompt_response, messages, skipped;
    uint64_t record_bytes;  /* of the record being built */
};

/* ---- the records' tokens ---------------------------------------------------------- */

static int put(struct chat *c, int32_t id, int trained)
{
    struct records *r = &c->rec;
    if (r->n == r->cap) {
        size_t grown = r->cap ? r->cap * 2 : 1 << 16;
        int32_t *ids = realloc(r->ids, grown * sizeof *ids);
        if (ids)
            r->ids = ids;
        unsigned char *t = ids ? realloc(r->trained, grown) : NULL;
        if (!t)
            return tr_prepare_fail("out of memory (%zu tokens so far)", r->n);
        r->trained = t;
        r->cap = grown;
    }
    r->ids[r->n] = id;
    r->trained[r->n++] = (unsigned char)trained;
    return 0;
}

/* Encode text (special tokens written in it are recognised, as the
 * tokenizers library does) and append it with one mask bit for all. */
static int put_text(struct chat *c, const char *where, const char *text, size_t len,
                    int trained)
{
    if (len == 0)
        return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    tr_err err;
    if (tr_tokenizer_encode(c->tok, text, len, &ids, &n, &err) != TR_OK)
        return tr_prepare_fail("%s: cannot encode: %s", where, err.msg);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = put(c, ids[i], trained);
    free(ids);
    c->record_bytes += len;
    return rc;
}

static int put_str(struct chat *c, const char *where, const char *text, int trained)
{
    return put_text(c, where, text, strlen(text), trained);
}

/* Close the record being built: its tokens end here. */
static int end_record(struct chat *c)
{
    struct records *r = &c->rec;
    if (r->count + 1 >= r->count_cap) {
        size_t grown = r->count_cap ? r->count_cap * 2 : 1024;
        size_t *start = realloc(r->start, grown * sizeof *start);
        if (start)
            r->start = start;
        uint64_t *bytes = start ? realloc(r->text_bytes, grown * sizeof *bytes) : NULL;
        if (!bytes)
            return tr_prepare_fail("out of memory (%zu records so far)", r->count);
        r->text_bytes = bytes;
        r->count_cap = grown;
    }
    r->text_bytes[r->count] = c->record_bytes;
    r->start[++r->count] = r->n;
    c->record_bytes = 0;
    return 0;
}

/* ---- the two kinds of record ------------------------------------------------------- */

static int prompt_response(struct chat *c, const char *where, const char *prompt,
                           const char *response)
{
    if (!*response)
        return tr_prepare_fail("%s: the response is empty: nothing to train on", where);
    int rc = c->bos >= 0 ? put(c, c->bos, 0) : 0;
    if (rc == 0)
        rc = put_str(c, where, prompt, 0);
    if (rc == 0)
        rc = put_str(c, where, response, 1);
    if (rc == 0)
        rc = put(c, c->pt.eos, 1); /* learning to stop is part of the answer */
    return rc;
}

static int messages(struct chat *c, const char *where, const struct tr_json *list)
{
    if (c->tmpl.family == TR_CHAT_NONE)
        return tr_prepare_fail("%s: a \"messages\" record needs a chat template, but %s; write "
                               "{\"prompt\", \"response\"} records instead", where,
                               c->tmpl.why);
    if (list->type != TR_JSON_ARRAY || list->n == 0)
        return tr_prepare_fail("%s: \"messages\" must be a non-empty list of {\"role\", "
                               "\"content\"} objects", where);
    struct tr_chat_message *m = tr_xcalloc(list->n, sizeof *m);
    int assistant = 0;
    for (size_t i = 0; i < list->n; i++) {
        const struct tr_json *j = list->items[i];
        m[i].role = j->type == TR_JSON_OBJECT ? tr_json_string(j, "role") : NULL;
        m[i].content = j->type == TR_JSON_OBJECT ? tr_json_string(j, "content") : NULL;
        if (!m[i].role || !m[i].content) {
            free(m);
            return tr_prepare_fail("%s: message %zu needs string \"role\" and \"content\" "
                                   "fields", where, i + 1);
        }
        int is_assistant = strcmp(m[i].role, "assistant") == 0;
        if (!is_assistant && strcmp(m[i].role, "user") != 0 && strcmp(m[i].role, "system") != 0) {
            int rc = tr_prepare_fail("%s: message %zu has role \"%s\"; roles are system, user "
                                     "and assistant", where, i + 1, m[i].role);
            free(m);
            return rc;
        }
        assistant |= is_assistant;
    }
    if (!assistant) {
        free(m);
        return tr_prepare_fail("%s: no assistant message: nothing to train on", where);
    }
    /* what apply_chat_template(messages, tokenize=True) gives: the template's text (its
     * default system prompt included) tokenized whole, without the post-processor's BOS */
    char *text = NULL;
    size_t len = 0, n = 0;
    unsigned char *bytes_trained = NULL, *trained = NULL;
    int32_t *ids = NULL;
    tr_err err = {{0}};
    int rc = tr_chat_render(&c->tmpl, m, list->n, 0, &text, &len, &bytes_trained, &err);
    if (rc == TR_OK)
        rc = tr_chat_encode(c->tok, text, len, bytes_trained, &ids, &trained, &n, &err);
    if (rc != TR_OK)
        rc = tr_prepare_fail("%s: cannot encode: %s", where, err.msg);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = put(c, ids[i], trained[i]);
    c->record_bytes += len;
    free(m);
    free(text);
    free(bytes_trained);
    free(ids);
    free(trained);
    return rc;
}

/* One JSONL record: either kind, else an error naming file:line. */
static int record(struct chat *c, const char *path, long line, const struct tr_json *rec)
{
    char where[4200];
    snprintf(where, sizeof where, "%s:%ld", path, line);
    const struct tr_json *msgs = tr_json_get(rec, "messages");
    const char *prompt = tr_json_string(rec, "prompt"), *response = tr_json_string(rec, "response");
    size_t mark = c->rec.n;
    int rc;
    if (msgs) {
        rc = messages(c, where, msgs);
        c->messages += rc == 0;
    } else if (prompt && response) {
        rc = prompt_response(c, where, prompt, response);
        c->prompt_response += rc == 0;
    } else {
        rc = tr_prepare_fail("%s: a record needs string \"prompt\" and \"response\" fields, "
                             "or a \"messages\" list", where);
    }
    if (rc != 0) {
        c->rec.n = mark; /* drop what the record had put */
        c->record_bytes = 0;
        return -1;
    }
    return end_record(c);
}

static int read_records(struct chat *c)
{
    const struct prepare_opts *o = c->o;
    for (int i = 0; i < o->n_inputs; i++) {
        unsigned char *data;
        size_t size;
        if (tr_prepare_read_input(o->inputs[i], &data, &size) != 0)
            return -1;
        struct tr_jsonl it;
        tr_jsonl_init(&it, o->inputs[i], data, size);
        struct tr_json *rec;
        int got, rc = 0;
        while (rc == 0 && (got = tr_jsonl_next(&it, &rec)) != 0) {
            if (got < 0) {
                if (!o->skip_bad_records)
                    rc = tr_prepare_fail("%s", it.error);
                c->skipped += o->skip_bad_records;
                continue;
            }
            rc = record(c, o->inputs[i], it.line, rec);
            tr_json_free(rec);
            if (rc != 0 && o->skip_bad_records) {
                c->skipped++;
                rc = 0;
            }
        }
        free(data);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* ---- the chat template ---------------------------------------------------------------- */

static int find_template(struct chat *c)
{
    tr_err err = {{0}};
    if (tr_chat_template_read(&c->tmpl, (const char *)c->pt.config, c->pt.config_size,
                              c->pt.config ? c->pt.config_path : c->pt.path, &err) != TR_OK)
        return tr_prepare_fail("%s", err.msg);
    return 0;
}

/* The template's special tokens must be single tokens of the vocabulary, or
 * the rendering would spell them out as text. */
static int check_family_tokens(struct chat *c)
{
    static const char *const chatml[] = {"<|im_start|>", "<|im_end|>", NULL};
    const char *llama3[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                            c->tmpl.bos, NULL};
    const char *const *need = c->tmpl.family == TR_CHAT_CHATML ? chatml
                              : c->tmpl.family == TR_CHAT_LLAMA3 ? llama3 : NULL;
    for (int i = 0; need && need[i]; i++)
        if (tr_tokenizer_token_id(c->tok, need[i]) < 0)
            return tr_prepare_fail("%s's chat template uses %s, but %s has no such token; is "
                                   "it the tokenizer the template belongs to?",
                                   c->pt.config_path, need[i], c->pt.path);
    return 0;
}

/* ---- output ------------------------------------------------------------------------------ */

struct split_result {
    size_t records;
    uint64_t tokens, trained, text_bytes;
    int shards;
};

static int write_split(struct chat *c, size_t from, size_t to, const char *prefix,
                       struct split_result *s)
{
    const struct records *r = &c->rec;
    struct tr_shard_writer *w = tr_shard_writer_open(c->o->out_dir, prefix, c->o->shard_tokens,
                                                     c->pt.vocab, 1);
    if (!w)
        return -1;
    int rc = 0;
    for (size_t k = from; k < to && rc == 0; k++) {
        for (size_t i = r->start[k]; i < r->start[k + 1] && rc == 0; i++) {
            rc = tr_shard_writer_put(w, (uint32_t)r->ids[i], r->trained[i]);
            s->trained += r->trained[i];
        }
        tr_shard_writer_add_text_bytes(w, r->text_bytes[k]);
        s->records++;
    }
    if (rc == 0)
        rc = tr_shard_writer_finish(w);
    s->tokens = tr_shard_writer_tokens(w);
    s->text_bytes = tr_shard_writer_text_bytes(w);
    s->shards = tr_shard_writer_shards(w);
    tr_shard_writer_free(w);
    if (rc == 0)
        tr_prepare_remove_stale_shards(c->o->out_dir, prefix, s->shards);
    return rc;
}

static int write_json(struct chat *c, const struct split_result s[2])
{
    const struct prepare_opts *o = c->o;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/prepare.json", o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    fputs("{\n  \"format\": \"instruct\",\n", f);
    tr_prepare_json_inputs(f, o);
    fputs("  \"tokenizer\": {\"file\": \"tokenizer.json\", \"source\": ", f);
    tr_json_write_string(f, c->pt.path);
    fprintf(f, ", \"hash\": \"%016llx\", \"vocab\": %u, \"eos\": %d%s},\n",
            (unsigned long long)c->pt.hash, c->pt.vocab, (int)c->pt.eos,
            c->pt.config ? ", \"config\": \"tokenizer_config.json\"" : "");
    fprintf(f, "  \"vocab\": %u,\n  \"dtype\": \"%s\",\n  \"chat_template\": ", c->pt.vocab,
            c->pt.vocab <= 65536 ? "uint16" : "uint32");
    if (tr_chat_family_name(c->tmpl.family))
        fprintf(f, "\"%s\",\n", tr_chat_family_name(c->tmpl.family));
    else
        fputs("null,\n", f);
    fprintf(f, "  \"records\": {\"read\": %zu, \"prompt_response\": %zu, \"messages\": %zu, "
               "\"skipped\": %zu},\n",
            c->prompt_response + c->messages + c->skipped, c->prompt_response, c->messages,
            c->skipped);
    fprintf(f, "  \"val_fraction\": %g,\n  \"shard_tokens\": %llu,\n", o->val_fraction,
            (unsigned long long)o->shard_tokens);
    static const char *const names[2] = {"train", "val"};
    uint64_t trained = 0, tokens = 0;
    for (int k = 0; k < 2; k++) {
        fprintf(f, "  \"%s\": {\"records\": %zu, \"tokens\": %llu, \"trained_tokens\": %llu, "
                   "\"masked_tokens\": %llu, \"text_bytes\": %llu, \"shards\": [",
                names[k], s[k].records, (unsigned long long)s[k].tokens,
                (unsigned long long)s[k].trained,
                (unsigned long long)(s[k].tokens - s[k].trained),
                (unsigned long long)s[k].text_bytes);
        for (int i = 0; i < s[k].shards; i++)
            fprintf(f, "%s\"%s_%06d.bin\"", i ? ", " : "", names[k], i);
        fputs("]},\n", f);
        trained += s[k].trained;
        tokens += s[k].tokens;
    }
    fprintf(f, "  \"trained_tokens\": %llu,\n  \"masked_tokens\": %llu\n}\n",
            (unsigned long long)trained, (unsigned long long)(tokens - trained));
    return tr_prepare_publish(tmp, path, f);
}

/* ---- the path ------------------------------------------------------------------------------ */

static int prepare_instruct(struct chat *c)
{
    const struct prepare_opts *o = c->o;
    const struct records *r = &c->rec;
    c->tok = c->pt.tok[0];
    if (c->pt.eos < 0)
        return tr_prepare_fail("%s: no end-of-sequence token was found, and instruction data "
                               "needs one (the model learns to stop); name it with --eos",
                               c->pt.path);
    c->bos = tr_tokenizer_bos_id(c->tok);
    if (find_template(c) != 0 || check_family_tokens(c) != 0)
        return -1;
    /* some configs name the turn opener as eos_token (SmolLM2's bos and eos are
     * <|im_start|> / <|im_end|>, and copies mix them up): a response ending with
     * it would teach the model to open a turn where it should stop, and sample
     * does not stop there.  The template's end of turn is where answers end. */
    if (c->tmpl.family != TR_CHAT_NONE && c->pt.eos_from &&
        strcmp(c->pt.eos_from, "--eos") != 0 &&
        c->pt.eos == tr_tokenizer_token_id(c->tok, c->tmpl.opener)) {
        int32_t eot = tr_tokenizer_token_id(c->tok, c->tmpl.end_of_turn);
        char *text = strdup(c->tmpl.end_of_turn);
        if (!text)
            return tr_prepare_fail("out of memory");
        printf("trainrun prepare: %s names %s, the chat template's turn opener, as eos_token; "
               "prompt/response records end with its end of turn %s (id %d) instead (--eos "
               "TOKEN names another)\n", c->pt.eos_from, c->pt.eos_text ? c->pt.eos_text : "?",
               text, (int)eot);
        free(c->pt.eos_text);
        c->pt.eos_text = text;
        c->pt.eos = eot;
        c->pt.eos_from = "the chat template's end of turn";
    }
    c->rec.start = malloc(1024 * sizeof *c->rec.start);
    c->rec.text_bytes = malloc(1024 * sizeof *c->rec.text_bytes);
    if (!c->rec.start || !c->rec.text_bytes)
        return tr_prepare_fail("out of memory");
    c->rec.count_cap = 1024;
    c->rec.start[0] = 0;
    if (read_records(c) != 0)
        return -1;
    if (r->count == 0)
        return tr_prepare_fail("no records in the input%s%s; each line is a JSON object with "
                               "\"prompt\" and \"response\", or \"messages\"",
                               o->n_inputs == 1 ? "" : "s",
                               c->skipped ? " (all were skipped)" : "");
    printf("trainrun prepare: %zu record%s (%zu prompt/response, %zu messages%s%s), %zu "
           "tokens\n", r->count, r->count == 1 ? "" : "s", c->prompt_response, c->messages,
           c->tmpl.family ? " as " : "",
           c->tmpl.family ? tr_chat_family_name(c->tmpl.family) : "", r->n);
    if (c->skipped)
        printf("trainrun prepare: skipped %zu bad record%s\n", c->skipped,
               c->skipped == 1 ? "" : "s");

    /* validation: whole records from the end, at least val_fraction of the
     * tokens, always leaving one training record */
    uint64_t want = (uint64_t)((double)r->n * o->val_fraction);
    size_t val_from = r->count;
    while (want > 0 && r->n - r->start[val_from] < want && val_from > 1)
        val_from--;
    if (want > 0 && val_from == r->count)
        fprintf(stderr, "trainrun prepare: warning: only one record, so there is no "
                        "validation split\n");

    if (tr_mkdir_p(o->out_dir) != 0)
        return tr_prepare_fail("cannot create the output directory %s: %s", o->out_dir,
                               strerror(errno));
    struct split_result s[2] = {{0}, {0}};
    if (tr_prepare_claim_out_dir(o->out_dir) != 0 ||
        tr_prepare_write_copy(o->out_dir, "tokenizer.json", c->pt.file, c->pt.file_size) != 0 ||
        (c->pt.config && tr_prepare_write_copy(o->out_dir, "tokenizer_config.json",
                                               c->pt.config, c->pt.config_size) != 0) ||
        write_split(c, 0, val_from, "train", &s[0]) != 0 ||
        write_split(c, val_from, r->count, "val", &s[1]) != 0 || write_json(c, s) != 0)
        return -1;
    printf("trainrun prepare: vocabulary %u: train %llu tokens (%llu trained on) in %zu "
           "record%s, val %llu tokens (%llu trained on) in %zu record%s\n",
           c->pt.vocab, (unsigned long long)s[0].tokens, (unsigned long long)s[0].trained,
           s[0].records, s[0].records == 1 ? "" : "s", (unsigned long long)s[1].tokens,
           (unsigned long long)s[1].trained, s[1].records, s[1].records == 1 ? "" : "s");
    printf("trainrun prepare: wrote %s/prepare.json; use\n"
           "  data = { plugin = \"tokens\", train = \"%s/train_*.bin\"%s%s%s }\n",
           o->out_dir, o->out_dir, s[1].shards ? ", val = \"" : ", val_fraction = 0",
           s[1].shards ? o->out_dir : "", s[1].shards ? "/val_*.bin\"" : "");
    return 0;
}

int tr_prepare_instruct(const struct prepare_opts *o)
{
    if (strcmp(o->tokenizer, "byte") == 0 || strcmp(o->tokenizer, "char") == 0)
        return tr_prepare_fail("--format instruct needs --tokenizer PATH/tokenizer.json: the "
                               "model's own tokenizer, whose end-of-sequence and chat tokens "
                               "the records are written with (byte and char have none)");
    struct chat c = {.o = o};
    int rc = tr_prepare_tokenizer_load(&c.pt, o, 1);
    if (rc == 0)
        rc = prepare_instruct(&c);
    tr_prepare_tokenizer_free(&c.pt);
    tr_chat_template_free(&c.tmpl);
    free(c.rec.ids);
    free(c.rec.trained);
    free(c.rec.start);
    free(c.rec.text_bytes);
    return rc;
}
