/*
 * The conversion of a loaded recipe's Lua table into the C tree (value.h),
 * recipe.c's last step of tr_recipe_load.  Internal to core/config.
 */
#ifndef TR_RECIPE_CONVERT_H
#define TR_RECIPE_CONVERT_H

#include "value.h"
#include "../util/util.h"

#include <lua.h>

/* Deeper nesting than this in a recipe table is a mistake, not a config. */
#define TR_RECIPE_MAX_DEPTH 200

struct tr_convert {
    lua_State *L;
    tr_err *err;
    int failed;
    int origins_ref;
    int result_ref;
    const char *top_file;
    struct tr_value *root;
    long values;
    const void *tables[TR_RECIPE_MAX_DEPTH]; /* tables on the current path, for cycles */
};

/* Under lua_cpcall with a struct tr_convert as its light userdata: fills
 * c->root from the table at registry result_ref, with the origins at
 * registry origins_ref; a failure sets c->failed and c->err.  Running out
 * of memory inside the Lua API is then an error, not a panic. */
int tr_recipe_convert_protected(lua_State *L);

#endif
