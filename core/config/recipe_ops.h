/* What the op table (kernels/ops.h) answers for recipe code, and the
 * reading of a node's attributes from Lua that the answer and the model
 * reader (engine/model.c) share.
 *
 * The recipe's Lua state gets one pure function of the table, `shape` of
 * the module trainrun.ops (host.op_shape in lua/trainrun/recipe.lua):
 *
 *   ops.shape(op, inputs, attrs) -> shape | nil, why
 *
 * op is an op's name ("linear"), inputs a list of 1 to 3 tensor handles
 * ({name, shape, dtype = "f32" | "i32", role}, as nn.lua makes them), attrs
 * a table of the node's attributes as a node table carries them (eps,
 * heads, kernel = {3, 3}, ...), except that a tensor attribute (batchnorm's
 * buffer) is a handle, not an id.  It runs the op's whole check
 * (tr_op_check: input count, ids, attribute kinds and ranges, the shape
 * rule) on throwaway structs and returns the output's shape as a new list,
 * or nil and the rule's sentence ("input 'x' [2,8,16] has 16 features but
 * weight 'w' [32,24] expects 24").  It reads its arguments raw (no
 * metamethod runs), allocates nothing the Lua heap does not own, and
 * refuses any argument it cannot read with a sentence: it is safe to hand
 * to recipe code, which may call it with anything.
 *
 * Why here, in config, and not in engine: the recipe's state is built
 * here (recipe.c), and the function needs only the op table, which lives
 * in kernels/ beside backend.h for the core and the backends alike.  Of
 * kernels/, config includes that header alone (tests/e2e/layering.sh). */
#ifndef TR_RECIPE_OPS_H
#define TR_RECIPE_OPS_H

#include "../../kernels/ops.h"

#include <lua.h>
#include <stddef.h>
#include <stdint.h>

/* The function above, as a lua_CFunction. */
int tr_recipe_op_shape(lua_State *L);

/* Pushes the module table trainrun.ops: { shape = tr_recipe_op_shape }. */
void tr_recipe_push_ops(lua_State *L);

/* ---- reading Lua values, for both sides ---------------------------------- */

/* The value at idx as an integer in [lo, hi]: a number with a whole value
 * (no wrap, no truncation of 2.5 or 2^62); 0 when it is not one. */
int tr_lua_whole_number(lua_State *L, int idx, int64_t lo, int64_t hi, int64_t *out);

/* A short description of the value at idx, for messages: "16", "nan",
 * "the string \"x\"", "missing", "{1, 0}", "a table of 3 items", "a boolean". */
const char *tr_lua_describe(lua_State *L, int idx, char *buf, size_t size);

/* A tensor attribute's value at idx as the index of a tensor (0-based);
 * 0, or -1 with why ("the buffer is 7; it must be ..."). */
typedef int (*tr_attr_tensor_fn)(lua_State *L, int idx, const struct tr_attr_desc *d, void *ud,
                                 int *out, char *why, size_t size);

/* The attributes in `mask` (TR_ATTR() bits) of the node table at index t
 * (read raw) into their fields of n, each checked by its kind in
 * tr_attrs[]; an absent one takes its fallback, a tensor attribute is read
 * by `tensor`.  0, or -1 with why, a sentence naming the attribute and the
 * value ("'stride' is {1, 0}; it must be a whole number from 1 to 65536,
 * or a pair {h, w} of them").  In tr_attrs order, so a node with two bad
 * attributes always gets the same error. */
int tr_node_attrs_read(lua_State *L, int t, unsigned mask, struct tr_node *n,
                       tr_attr_tensor_fn tensor, void *ud, char *why, size_t size);

#endif
