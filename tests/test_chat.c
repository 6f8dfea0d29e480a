/* Chat templates against transformers: tests/fixtures/chat/cases.json holds what
 * apply_chat_template renders (text) and tokenizes (ids) for ChatML (SmolLM2-Instruct's
 * template, whose default system prompt is put when the messages have none) and Llama 3
 * (Meta-Llama-3-Instruct's: bos_token written by the template, contents trimmed), with and
 * without system messages and with the generation prompt; made offline by
 * tests/fixtures/chat/make_fixtures.py (transformers 4.46.3, tokenizers 0.20.3).  Both
 * tokenizers' post-processors add a BOS, which apply_chat_template does not.  Also: the
 * mask on assistant turns, default system prompts written as Jinja escapes (Qwen2), and
 * templates that are refused.
 *
 * Covers: core/tokenizer/chat.c.
 */
#include <criterion/criterion.h>

#include "util/json.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurp.h"

#define FIX TR_TEST_SRCDIR "/fixtures/chat/"


static void read_template(struct tr_chat_template *ct, const char *config)
{
    tr_err err = {{0}};
    cr_assert_eq(tr_chat_template_read(ct, config, strlen(config), "test_config.json", &err),
                 TR_OK, "%s", err.msg);
}

/* Every case of one family: the text and ids transformers gave. */
static void check_family(const char *family)
{
    size_t len;
    char *text = tr_test_slurp(FIX "cases.json", &len);
    struct tr_json *all = tr_json_parse(text, len, NULL);
    cr_assert(all);
    const struct tr_json *fam = tr_json_get(all, family);
    cr_assert(fam);
    char path[512];
    snprintf(path, sizeof path, FIX "%s/tokenizer_config.json", family);
    size_t clen;
    char *config = tr_test_slurp(path, &clen);
    struct tr_chat_template ct;
    tr_err err = {{0}};
    cr_assert_eq(tr_chat_template_read(&ct, config, clen, path, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(tr_chat_family_name(ct.family), family);
    cr_assert_str_eq(ct.end_of_turn, tr_json_string(fam, "end_of_turn"));
    snprintf(path, sizeof path, FIX "%s/tokenizer.json", family);
    struct tr_tokenizer *tok = tr_tokenizer_load(path, &err);
    cr_assert(tok, "%s", err.msg);
    cr_assert_eq(tr_tokenizer_token_id(tok, ct.end_of_turn),
                 (int32_t)tr_json_number(fam, "end_of_turn_id", -1));
    /* the post-processor adds a BOS: what apply_chat_template leaves out */
    cr_assert_geq(tr_tokenizer_bos_id(tok), 0);
    const struct tr_json *cases = tr_json_get(fam, "cases");
    cr_assert(cases && cases->n >= 5);
    for (size_t c = 0; c < cases->n; c++) {
        const struct tr_json *k = cases->items[c], *msgs = tr_json_get(k, "messages");
        struct tr_chat_message m[8];
        cr_assert(msgs->n <= 8);
        for (size_t i = 0; i < msgs->n; i++)
            m[i] = (struct tr_chat_message){tr_json_string(msgs->items[i], "role"),
                                            tr_json_string(msgs->items[i], "content")};
        int gen = tr_json_get(k, "add_generation_prompt")->boolean;
        char *out = NULL;
        size_t olen = 0;
        unsigned char *bits = NULL;
        cr_assert_eq(tr_chat_render(&ct, m, msgs->n, gen, &out, &olen, &bits, &err), TR_OK,
                     "%s", err.msg);
        cr_assert_str_eq(out, tr_json_string(k, "text"), "%s case %zu renders otherwise",
                         family, c);
        cr_assert_eq(olen, strlen(out));
        int32_t *ids = NULL;
        unsigned char *trained = NULL;
        size_t n = 0;
        cr_assert_eq(tr_chat_encode(tok, out, olen, bits, &ids, &trained, &n, &err), TR_OK,
                     "%s", err.msg);
        const struct tr_json *want = tr_json_get(k, "ids");
        cr_assert_eq(n, want->n, "%s case %zu: %zu ids, transformers %zu", family, c, n, want->n);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(ids[i], (int32_t)want->items[i]->number, "%s case %zu id %zu: %d, "
                         "transformers %d", family, c, i, ids[i], (int)want->items[i]->number);
        /* trained: exactly the assistant contents' tokens and their end-of-turn; the
         * generation prompt trains nothing */
        size_t assistants = 0, eot_trained = 0;
        for (size_t i = 0; i < msgs->n; i++)
            assistants += strcmp(m[i].role, "assistant") == 0;
        for (size_t i = 0; i < n; i++)
            if (trained[i] && ids[i] == tr_tokenizer_token_id(tok, ct.end_of_turn))
                eot_trained++;
        cr_assert_eq(eot_trained, assistants, "%s case %zu", family, c);
        cr_assert_eq(trained[0], 0);
        if (gen)
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(trained[i], 0);
        free(out);
        free(bits);
        free(ids);
        free(trained);
    }
    tr_tokenizer_free(tok);
    tr_chat_template_free(&ct);
    tr_json_free(all);
    free(config);
    free(text);
}

Test(chat, chatml_as_transformers)
{
    check_family("chatml");
}

Test(chat, llama3_as_transformers)
{
    check_family("llama3");
}

/* The mask of a ChatML conversation, token by token: "Light." and <|im_end|> trained. */
Test(chat, mask_on_assistant_content_and_end)
{
    struct tr_chat_template ct;
    size_t clen;
    char *config = tr_test_slurp(FIX "chatml/tokenizer_config.json", &clen);
    tr_err err = {{0}};
    cr_assert_eq(tr_chat_template_read(&ct, config, clen, "c", &err), TR_OK);
    struct tr_tokenizer *tok = tr_tokenizer_load(FIX "chatml/tokenizer.json", &err);
    cr_assert(tok, "%s", err.msg);
    struct tr_chat_message m[] = {{"system", "Be brief."}, {"user", "Hi"},
                                  {"assistant", "Light."}};
    char *text;
    size_t len, n;
    unsigned char *bits, *trained;
    int32_t *ids;
    cr_assert_eq(tr_chat_render(&ct, m, 3, 0, &text, &len, &bits, &err), TR_OK);
    cr_assert_eq(tr_chat_encode(tok, text, len, bits, &ids, &trained, &n, &err), TR_OK);
    char *got = NULL;
    size_t glen = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (trained[i] && first == n)
            first = i;
    for (size_t i = first; i < n; i++)
        cr_assert_eq(trained[i], ids[i] != tr_tokenizer_token_id(tok, "\n"), "token %zu", i);
    cr_assert_eq(tr_tokenizer_decode(tok, ids + first, n - first, &got, &glen, &err), TR_OK);
    cr_assert_str_eq(got, "Light.<|im_end|>\n");
    free(got);
    free(text);
    free(bits);
    free(ids);
    free(trained);
    tr_tokenizer_free(tok);
    tr_chat_template_free(&ct);
    free(config);
}

/* Qwen2's template writes its default system prompt with Jinja's \n escapes; a template
 * whose system turn takes the first message's content has no default. */
Test(chat, default_system_prompt_from_the_template_text)
{
    struct tr_chat_template ct;
    read_template(&ct, "{\"chat_template\": \"{% for message in messages %}{% if loop.first and "
                       "messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\\\nYou are a "
                       "helpful \\\\'assistant\\\\'.<|im_end|>\\\\n' }}{% endif %}{{'<|im_start|>'"
                       " + message['role'] + '\\\\n' + message['content'] + '<|im_end|>' + "
                       "'\\\\n'}}{% endfor %}\"}");
    cr_assert_eq(ct.family, TR_CHAT_CHATML);
    cr_assert_str_eq(ct.default_system, "You are a helpful 'assistant'.");
    cr_assert_eq(ct.trim, 0);
    struct tr_chat_message m[] = {{"user", "Hi"}};
    char *text;
    size_t len;
    tr_err err;
    cr_assert_eq(tr_chat_render(&ct, m, 1, 1, &text, &len, NULL, &err), TR_OK);
    cr_assert_str_eq(text, "<|im_start|>system\nYou are a helpful 'assistant'.<|im_end|>\n"
                           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(text);
    tr_chat_template_free(&ct);

    read_template(&ct, "{\"chat_template\": \"{{ '<|im_start|>system\\\\n' + messages[0]"
                       "['content'] + '<|im_end|>' }}\"}");
    cr_assert_eq(ct.family, TR_CHAT_CHATML);
    cr_assert_null(ct.default_system);
    tr_chat_template_free(&ct);
}

/* Python's str.strip(): Unicode spaces too, and only with `| trim` in the template. */
Test(chat, trim_as_jinja)
{
    struct tr_chat_template ct;
    read_template(&ct, "{\"bos_token\": {\"content\": \"<B>\"}, \"chat_template\": \"{{ "
                       "bos_token }}<|start_header_id|>{{ message['content']|trim }}\"}");
    cr_assert_eq(ct.family, TR_CHAT_LLAMA3);
    cr_assert_eq(ct.trim, 1);
    cr_assert_str_eq(ct.bos, "<B>");
    struct tr_chat_message m[] = {{"user", "\xc2\xa0 \t\nA b\xe3\x80\x80\r\n"}};
    char *text;
    size_t len;
    tr_err err;
    cr_assert_eq(tr_chat_render(&ct, m, 1, 0, &text, &len, NULL, &err), TR_OK);
    cr_assert_str_eq(text, "<B><|start_header_id|>user<|end_header_id|>\n\nA b<|eot_id|>");
    free(text);
    tr_chat_template_free(&ct);
}

Test(chat, refused_templates_say_why)
{
    struct tr_chat_template ct;
    read_template(&ct, "{\"chat_template\": \"<|start_header_id|>system<|end_header_id|>"
                       "Cutting Knowledge Date: December 2023\"}");
    cr_assert_eq(ct.family, TR_CHAT_NONE);
    cr_assert(strstr(ct.why, "Llama 3.1") && strstr(ct.why, "test_config.json"), "%s", ct.why);
    read_template(&ct, "{\"chat_template\": \"[INST] {{ message['content'] }} [/INST]\"}");
    cr_assert_eq(ct.family, TR_CHAT_NONE);
    cr_assert(strstr(ct.why, "not one trainrun renders"), "%s", ct.why);
    read_template(&ct, "{\"eos_token\": \"</s>\"}");
    cr_assert_eq(ct.family, TR_CHAT_NONE);
    cr_assert(strstr(ct.why, "has no chat_template"), "%s", ct.why);
    struct tr_chat_message m[] = {{"user", "Hi"}};
    char *text;
    size_t len;
    tr_err err;
    cr_assert_eq(tr_chat_render(&ct, m, 1, 0, &text, &len, NULL, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "has no chat_template"), "%s", err.msg);
    cr_assert_eq(tr_chat_template_read(&ct, "{", 1, "bad.json", &err), TR_ERROR);
    cr_assert(strstr(err.msg, "bad.json"), "%s", err.msg);
}
