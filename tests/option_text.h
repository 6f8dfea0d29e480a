/*
 * One option's recipe text parsed into a plugin config, as the core does
 * once the recipe is checked: what the plugin tests and the fuzzer share
 * to fill configs without the core's option machinery.  No test framework
 * here: tests/fuzz.c is a plain program.
 */
#ifndef TR_TESTS_OPTION_TEXT_H
#define TR_TESTS_OPTION_TEXT_H

#include <trainrun/plugin.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* text: the option's value as a recipe writes it; strings are kept by
 * pointer, so text must outlive the config. */
static void set_text(const struct tr_option *o, void *config, const char *text)
{
    char *field = (char *)config + o->offset;
    switch (o->type) {
    case TR_OPT_INT: {
        int64_t v = strtoll(text, NULL, 10);
        memcpy(field, &v, sizeof v);
        break;
    }
    case TR_OPT_FLOAT: {
        double v = strtod(text, NULL);
        memcpy(field, &v, sizeof v);
        break;
    }
    case TR_OPT_BOOL: {
        int v = strcmp(text, "true") == 0;
        memcpy(field, &v, sizeof v);
        break;
    }
    case TR_OPT_STRING:
    case TR_OPT_ENUM:
        memcpy(field, &text, sizeof text);
        break;
    case TR_OPT_END:
        break;
    }
}

#endif
