/* NF4 storage (kernels/nf4.h): the layout. */
#include "nf4.h"

static size_t align4(size_t n) { return (n + 3) & ~(size_t)3; }

struct tr_nf4_parts tr_nf4_parts(size_t n)
{
    struct tr_nf4_parts p;
    p.blocks = n / TR_NF4_BLOCK;
    p.blocks2 = (p.blocks + TR_NF4_BLOCK2 - 1) / TR_NF4_BLOCK2;
    p.codes = 0;
    p.qabsmax = align4(n / 2);
    p.absmax2 = p.qabsmax + align4(p.blocks);
    p.offset = p.absmax2 + p.blocks2 * sizeof(float);
    p.bytes = p.offset + sizeof(float);
    return p;
}

size_t tr_nf4_bytes(size_t n) { return tr_nf4_parts(n).bytes; }
