/* The shard layout of data parallelism (shard.h says the rule). */
#include "shard.h"

#include "backend.h"

void tr_shard_init(struct tr_shard *s, size_t n, size_t unit_floats, int rank, int world,
                   enum tr_shard_level level)
{
    size_t w = world > 0 ? (size_t)world : 1;
    size_t unit = (unit_floats ? unit_floats : 1);
    unit = (unit + w - 1) / w * w;
    *s = (struct tr_shard){n, unit, n ? (n + unit - 1) / unit : 0, rank, (int)w, level};
}

size_t tr_shard_unit_floats(const struct tr_config *cfg)
{
    size_t unit = (size_t)(cfg->parallel.bucket_mb * 1024 * 1024) / sizeof(float);
    return unit < 1024 ? 1024 : unit;
}

struct tr_shard_run tr_shard_unit(const struct tr_shard *s, size_t u)
{
    size_t b = u * s->unit, e = b + s->unit < s->n ? b + s->unit : s->n;
    return (struct tr_shard_run){b, e};
}

size_t tr_shard_part_len(const struct tr_shard *s, size_t u)
{
    struct tr_shard_run r = tr_shard_unit(s, u);
    return (r.end - r.begin) / (size_t)s->world;
}

struct tr_shard_run tr_shard_part(const struct tr_shard *s, size_t u, int q)
{
    struct tr_shard_run r = tr_shard_unit(s, u);
    size_t per = tr_shard_part_len(s, u), b = r.begin + (size_t)q * per;
    return (struct tr_shard_run){b, q == s->world - 1 ? r.end : b + per};
}

size_t tr_shard_owned(const struct tr_shard *s, int q)
{
    size_t total = 0;
    for (size_t u = 0; u < s->n_units; u++) {
        struct tr_shard_run p = tr_shard_part(s, u, q);
        total += p.end - p.begin;
    }
    return total;
}

int tr_shard_sharded(const struct tr_shard *s)
{
    return s->level != TR_SHARD_NONE && s->world > 1;
}

void tr_shard_discard_others_of(const struct tr_backend *be, void *buf, size_t elem,
                                const struct tr_shard *s, size_t u)
{
    struct tr_shard_run r = tr_shard_unit(s, u), p = tr_shard_part(s, u, s->rank);
    struct tr_shard_run other[2] = {{r.begin, p.begin}, {p.end, r.end}};
    for (int k = 0; k < 2; k++) {
        size_t bytes = (other[k].end - other[k].begin) * elem;
        char *at = (char *)buf + other[k].begin * elem;
        if (bytes && tr_be_can_discard(be))
            tr_be_discard(be, at, bytes);
        else if (bytes)
            tr_be_zero(be, at, bytes);
    }
}

void tr_shard_discard_others(const struct tr_backend *be, float *buf, const struct tr_shard *s,
                             size_t u)
{
    tr_shard_discard_others_of(be, buf, sizeof(float), s, u);
}

const char *tr_shard_level_name(enum tr_shard_level level)
{
    return (unsigned)level <= TR_SHARD_PARAMETERS ? tr_shard_levels[level] : "?";
}
