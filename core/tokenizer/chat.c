/* Chat templates rendered as apply_chat_template renders them (chat.h). */
#include "chat.h"

#include "tokenizer.h"
#include "../util/json.h"
#include "../util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tr_chat_family_name(enum tr_chat_family f)
{
    return f == TR_CHAT_CHATML ? "chatml" : f == TR_CHAT_LLAMA3 ? "llama3" : NULL;
}

/* A special token's text from a config field: a string or {"content": ...}. */
static const char *token_field(const struct tr_json *config, const char *key)
{
    const struct tr_json *e = tr_json_get(config, key);
    return !e ? NULL
           : e->type == TR_JSON_STRING ? e->string
           : e->type == TR_JSON_OBJECT ? tr_json_string(e, "content") : NULL;
}

/* ChatML's default system prompt, read from the template text: the literal after
 * <|im_start|>system and a newline (a real one, or Jinja's \n escape) up to <|im_end|>, within
 * one string literal, so "'<|im_start|>system\n' + messages[0]['content']" is not one.
 * SmolLM2 ("You are a helpful AI assistant named SmolLM, ...") and Qwen2 ("You are a helpful
 * assistant.") write it so, put when the first message is not a system one.  NULL: none. */
static char *default_system(const char *tmpl)
{
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(tmpl, head); p; p = strstr(p + 1, head)) {
        const char *q = p + strlen(head);
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q)
            continue;
        char *out = tr_xcalloc((size_t)(end - q) + 1, 1);
        size_t n = 0;
        int literal = 1;
        for (const char *s = q; s < end && literal; s++) {
            if (*s == '\'' || *s == '"') {
                literal = 0; /* the literal ends: content comes from elsewhere */
            } else if (*s == '\\' && s + 1 < end) {
                s++; /* Jinja's string escapes */
                out[n++] = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s == 'r' ? '\r' : *s;
            } else {
                out[n++] = *s;
            }
        }
        if (literal)
            return out;
        free(out);
    }
    return NULL;
}

int tr_chat_template_read(struct tr_chat_template *ct, const char *config, size_t len,
                          const char *config_path, tr_err *err)
{
    memset(ct, 0, sizeof *ct);
    if (!config) {
        snprintf(ct->why, sizeof ct->why, "there is no tokenizer_config.json beside %s",
                 config_path);
        return TR_OK;
    }
    size_t at = 0;
    struct tr_json *cfg = tr_json_parse(config, len, &at);
    if (!cfg || cfg->type != TR_JSON_OBJECT) {
        tr_json_free(cfg);
        return tr_fail(err, "%s: not a JSON object (at byte %zu): is it the tokenizer's "
                       "tokenizer_config.json?", config_path, at);
    }
    const struct tr_json *field = tr_json_get(cfg, "chat_template");
    const char *tmpl = field && field->type == TR_JSON_STRING ? field->string : NULL;
    /* several named templates: [{"name": "default", "template": "..."}, ...] */
    for (size_t i = 0; field && field->type == TR_JSON_ARRAY && i < field->n && !tmpl; i++) {
        const struct tr_json *t = field->items[i];
        const char *name = t->type == TR_JSON_OBJECT ? tr_json_string(t, "name") : NULL;
        if (name && strcmp(name, "default") == 0)
            tmpl = tr_json_string(t, "template");
    }
    if (!tmpl) {
        snprintf(ct->why, sizeof ct->why, "%s has no chat_template (a string, or a list "
                 "holding one named \"default\")", config_path);
    } else if (strstr(tmpl, "<|im_start|>")) {
        ct->family = TR_CHAT_CHATML;
        ct->opener = "<|im_start|>";
        ct->end_of_turn = "<|im_end|>";
        ct->default_system = default_system(tmpl);
    } else if (strstr(tmpl, "Cutting Knowledge Date")) {
        /* Llama 3.1 and later always write a system turn with dates (and tools): not the
         * Llama 3 shape, so rendering it as that would not be what the model saw */
        snprintf(ct->why, sizeof ct->why, "the chat_template of %s is Llama 3.1's or later "
                 "(a system turn with \"Cutting Knowledge Date\"), which trainrun does not "
                 "render (it knows ChatML and Llama 3's)", config_path);
    } else if (strstr(tmpl, "<|start_header_id|>")) {
        ct->family = TR_CHAT_LLAMA3;
        ct->opener = "<|start_header_id|>";
        ct->end_of_turn = "<|eot_id|>";
        const char *bos = token_field(cfg, "bos_token");
        /* the template writes bos_token itself (what the config names), or spells it */
        if (strstr(tmpl, "bos_token"))
            ct->bos = tr_xstrdup(bos ? bos : "<|begin_of_text|>");
        else if (strstr(tmpl, "<|begin_of_text|>"))
            ct->bos = tr_xstrdup("<|begin_of_text|>");
    } else {
        snprintf(ct->why, sizeof ct->why, "the chat_template of %s is not one trainrun renders "
                 "(it knows ChatML, with <|im_start|>, and Llama 3, with <|start_header_id|>)",
                 config_path);
    }
    /* `message['content'] | trim` (Llama 3): Jinja's trim is Python's str.strip() */
    for (const char *p = tmpl ? strchr(tmpl, '|') : NULL; p && ct->family; p = strchr(p + 1, '|')) {
        const char *q = p + 1;
        while (*q == ' ')
            q++;
        if (strncmp(q, "trim", 4) == 0)
            ct->trim = 1;
    }
    tr_json_free(cfg);
    return TR_OK;
}

void tr_chat_template_free(struct tr_chat_template *ct)
{
    free(ct->default_system);
    free(ct->bos);
    ct->default_system = ct->bos = NULL;
}

/* ---- rendering ------------------------------------------------------------------------ */

/* Bytes of the whitespace character at s[0..n) (Python's str.isspace: ASCII's, \x1c-\x1f and
 * Unicode's spaces and separators), 0 when s does not start with one. */
static size_t space_at(const unsigned char *s, size_t n)
{
    if (n >= 1 && ((s[0] >= '\t' && s[0] <= '\r') || s[0] == ' ' || (s[0] >= 0x1c && s[0] <= 0x1f)))
        return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0))
        return 2;
    if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) /* U+1680 */
        return 3;
    /* U+2000-200A, U+2028, U+2029, U+202F */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 &&
        (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3;
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) /* U+205F */
        return 3;
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

static void trim(const char **s, size_t *n)
{
    const unsigned char *u = (const unsigned char *)*s;
    size_t a = 0, b = *n, k;
    while (a < b && (k = space_at(u + a, b - a)) > 0)
        a += k;
    for (int again = 1; again && b > a;) {
        again = 0;
        /* the last character starts at most 3 bytes back */
        for (size_t back = 1; back <= 3 && back <= b - a && !again; back++)
            if (space_at(u + b - back, back) == back) {
                b -= back;
                again = 1;
            }
    }
    *s += a;
    *n = b - a;
}

struct out {
    char *text;
    unsigned char *trained;
    size_t n, cap;
};

static void put(struct out *o, const char *s, size_t n, int trained)
{
    if (o->n + n + 1 > o->cap) {
        o->cap = (o->n + n + 1) * 2;
        o->text = tr_xrealloc(o->text, o->cap);
        o->trained = tr_xrealloc(o->trained, o->cap);
    }
    memcpy(o->text + o->n, s, n);
    memset(o->trained + o->n, trained, n);
    o->n += n;
    o->text[o->n] = '\0';
}

static void puts_(struct out *o, const char *s, int trained)
{
    put(o, s, strlen(s), trained);
}

int tr_chat_render(const struct tr_chat_template *ct, const struct tr_chat_message *m, size_t n,
                   int gen, char **text, size_t *len, unsigned char **trained, tr_err *err)
{
    if (ct->family == TR_CHAT_NONE)
        return tr_fail(err, "%s", ct->why);
    struct out o = {0};
    puts_(&o, "", 0);
    int chatml = ct->family == TR_CHAT_CHATML;
    for (size_t i = 0; i < n; i++) {
        const char *content = m[i].content;
        size_t clen = strlen(content);
        if (ct->trim)
            trim(&content, &clen);
        int assistant = strcmp(m[i].role, "assistant") == 0;
        if (chatml) {
            if (i == 0 && strcmp(m[0].role, "system") != 0 && ct->default_system) {
                puts_(&o, "<|im_start|>system\n", 0);
                puts_(&o, ct->default_system, 0);
                puts_(&o, "<|im_end|>\n", 0);
            }
            puts_(&o, "<|im_start|>", 0);
            puts_(&o, m[i].role, 0);
            puts_(&o, "\n", 0);
        } else {
            if (i == 0 && ct->bos)
                puts_(&o, ct->bos, 0);
            puts_(&o, "<|start_header_id|>", 0);
            puts_(&o, m[i].role, 0);
            puts_(&o, "<|end_header_id|>\n\n", 0);
        }
        /* learning to end the turn is part of the answer */
        put(&o, content, clen, assistant);
        puts_(&o, ct->end_of_turn, assistant);
        if (chatml)
            puts_(&o, "\n", 0);
    }
    if (gen)
        puts_(&o, chatml ? "<|im_start|>assistant\n"
                         : "<|start_header_id|>assistant<|end_header_id|>\n\n", 0);
    *text = o.text;
    *len = o.n;
    if (trained)
        *trained = o.trained;
    else
        free(o.trained);
    return TR_OK;
}

/* ---- tokenizing ------------------------------------------------------------------------- */

/* Each run of equal mask bits encoded on its own: the mask falls on token boundaries, for
 * tokenizers whose tokens do not give back the bytes they came from. */
static int encode_runs(struct tr_tokenizer *tok, const char *text, size_t len,
                       const unsigned char *bits, int32_t **ids, unsigned char **trained,
                       size_t *n, tr_err *err)
{
    int32_t *all = NULL;
    unsigned char *mask = NULL;
    size_t count = 0;
    for (size_t a = 0; a < len;) {
        size_t b = a;
        while (b < len && bits[b] == bits[a])
            b++;
        int32_t *part = NULL;
        size_t k = 0;
        if (tr_tokenizer_encode(tok, text + a, b - a, &part, &k, err) != TR_OK) {
            free(all);
            free(mask);
            return TR_ERROR;
        }
        all = tr_xrealloc(all, (count + k + 1) * sizeof *all);
        mask = tr_xrealloc(mask, count + k + 1);
        memcpy(all + count, part, k * sizeof *all);
        memset(mask + count, bits[a], k);
        count += k;
        free(part);
        a = b;
    }
    *ids = all ? all : tr_xcalloc(1, sizeof *all);
    *trained = mask ? mask : tr_xcalloc(1, 1);
    *n = count;
    return TR_OK;
}

int tr_chat_encode(struct tr_tokenizer *tok, const char *text, size_t len,
                   const unsigned char *trained_bytes, int32_t **ids, unsigned char **trained,
                   size_t *n, tr_err *err)
{
    if (tr_tokenizer_encode(tok, text, len, ids, n, err) != TR_OK)
        return TR_ERROR;
    if (!trained_bytes)
        return TR_OK;
    /* each token's bytes: where they lie in the text, when they add up to it */
    unsigned char *mask = tr_xcalloc(*n + 1, 1);
    size_t at = 0;
    int exact = 1;
    for (size_t i = 0; i < *n && exact; i++) {
        char *bytes = NULL;
        size_t k = 0;
        if (tr_tokenizer_decode(tok, *ids + i, 1, &bytes, &k, err) != TR_OK) {
            free(mask);
            free(*ids);
            return TR_ERROR;
        }
        exact = at + k <= len && memcmp(bytes, text + at, k) == 0;
        free(bytes);
        for (size_t b = at; exact && b < at + k; b++)
            mask[i] |= trained_bytes[b];
        at += k;
    }
    if (exact && at == len) {
        *trained = mask;
        return TR_OK;
    }
    free(mask);
    free(*ids);
    return encode_runs(tok, text, len, trained_bytes, ids, trained, n, err);
}
