/*
 * The 64-bit mixers trainrun uses wherever a number must be the same on
 * every machine: parameter initialisation, the loader's shuffle, the data
 * sources' splits and synthetic samples, `prepare`'s hashing.  Header-only,
 * so a plugin that wants the same reproducible streams includes it and
 * links nothing.  Neither is a cryptographic hash.
 *
 *   tr_mix64(x)          MurmurHash3's 64-bit finaliser: a bijection that
 *                        spreads every input bit over the output.
 *   tr_splitmix64(x)     SplitMix64's output for counter x: a random value
 *                        per (seed + counter), no state to carry.
 *   tr_splitmix64_next   the next value of a SplitMix64 stream whose state
 *                        starts at the seed (the same numbers as
 *                        tr_splitmix64(seed), tr_splitmix64(seed + golden),
 *                        ... with golden = 0x9e3779b97f4a7c15).
 *
 * Changing any of these changes every seeded result trainrun gives.
 */
#ifndef TRAINRUN_MIX_H
#define TRAINRUN_MIX_H

#include <stdint.h>

#define TR_GOLDEN64 0x9e3779b97f4a7c15ULL

static inline uint64_t tr_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static inline uint64_t tr_splitmix64(uint64_t x)
{
    x += TR_GOLDEN64;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline uint64_t tr_splitmix64_next(uint64_t *state)
{
    uint64_t x = *state;
    *state += TR_GOLDEN64;
    return tr_splitmix64(x);
}

#endif
