/*
 * What the plugin tests share to drive a built plugin the way the core
 * does: load its .so from $TR_PLUGIN_BUILD_DIR, fill its config from the
 * option defaults and from recipe text, and create/destroy an instance.
 * Include it once, after tests/scratch.h (run_dir and recipe_dir are its
 * tmp, allocation its test_alloc) and after defining the test's own
 * test_log, which receives what the plugins log.
 */
#ifndef TR_TESTS_PLUGIN_HARNESS_H
#define TR_TESTS_PLUGIN_HARNESS_H

#include "option_text.h" /* set_text */

#include <criterion/criterion.h>
#include <trainrun/plugin.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The tr_host the plugins are created with: the core's, but logging to
 * the test's test_log. */
static const struct tr_host host = {
    .struct_size = sizeof(struct tr_host),
    .log = test_log,
    .alloc = test_alloc,
    .free = free,
};

struct plugin {
    void *dl;
    const struct tr_plugin_info *info;
    void *config; /* config_size bytes, filled from the option defaults */
};

/* Open $TR_PLUGIN_BUILD_DIR/<file>.so; its config holds the defaults. */
static struct plugin load(const char *file)
{
    const char *dir = getenv("TR_PLUGIN_BUILD_DIR");
    cr_assert(dir && *dir, "set TR_PLUGIN_BUILD_DIR to the directory of the built plugins");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.so", dir, file);
    struct plugin p = {0};
    p.dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(p.dl, "dlopen %s: %s", path, dlerror());
    tr_plugin_entry_fn entry = (tr_plugin_entry_fn)dlsym(p.dl, TR_PLUGIN_ENTRY_NAME);
    cr_assert(entry, "%s does not export %s", path, TR_PLUGIN_ENTRY_NAME);
    p.info = entry();
    cr_assert(p.info, "%s: entry returned NULL", path);
    /* static storage: tests run in their own processes and load a few plugins */
    static max_align_t configs[8][64];
    static int next;
    cr_assert_leq(p.info->config_size, sizeof configs[0], "config too large for the test");
    p.config = configs[next++ % 8];
    memset(p.config, 0, sizeof configs[0]);
    for (const struct tr_option *o = p.info->options; o && o->type != TR_OPT_END; o++)
        if (o->default_value)
            set_text(o, p.config, o->default_value);
    return p;
}

/* Option `name` = recipe text `text`; the plugin must have the option. */
static void set(struct plugin *p, const char *name, const char *text)
{
    for (const struct tr_option *o = p->info->options; o && o->type != TR_OPT_END; o++) {
        if (strcmp(o->name, name) == 0) {
            set_text(o, p->config, text);
            return;
        }
    }
    cr_assert_fail("plugin %s has no option %s", p->info->name, name);
}

/* create() as a one-process run in tmp would call it. */
static int create(struct plugin *p, uint32_t seq_len, void **self, tr_err *err)
{
    struct tr_create_args args = {
        .struct_size = sizeof args, .run_dir = tmp, .recipe_dir = tmp,
        .seq_len = seq_len, .seed = 1, .rank = 0, .world = 1,
    };
    *self = NULL;
    return p->info->create(&host, p->config, &args, self, err);
}

static void *create_ok(struct plugin *p, uint32_t seq_len)
{
    void *self;
    tr_err err = {{0}};
    cr_assert_eq(create(p, seq_len, &self, &err), TR_OK, "%s: create failed: %s",
                 p->info->name, err.msg);
    return self;
}

/* Create must fail; the message must contain every given fragment. */
static void create_fails(struct plugin *p, uint32_t seq_len, const char *want1,
                         const char *want2)
{
    void *self;
    tr_err err = {{0}};
    cr_assert_eq(create(p, seq_len, &self, &err), TR_ERROR, "%s: create should fail",
                 p->info->name);
    cr_assert(strstr(err.msg, want1), "message lacks \"%s\": %s", want1, err.msg);
    cr_assert(!want2 || strstr(err.msg, want2), "message lacks \"%s\": %s", want2, err.msg);
}

static void destroy(struct plugin *p, void *self)
{
    if (p->info->destroy)
        p->info->destroy(self);
}

#endif
