#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct tr_progress {
    char label[32];
    uint64_t total;
    uint64_t done; /* added to by any thread (atomically) */
    double start, last_draw;
    int tty, drawn;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct tr_progress *tr_progress_start(const char *label, uint64_t total)
{
    struct tr_progress *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->tty = isatty(STDERR_FILENO);
    p->start = p->last_draw = now();
    return p;
}

void tr_progress_add(struct tr_progress *p, uint64_t bytes)
{
    if (p)
        __atomic_fetch_add(&p->done, bytes, __ATOMIC_RELAXED);
}

uint64_t tr_progress_done(const struct tr_progress *p)
{
    return p ? __atomic_load_n(&p->done, __ATOMIC_RELAXED) : 0;
}

double tr_progress_elapsed(const struct tr_progress *p) { return p ? now() - p->start : 0; }

static void hms(double seconds, char *out, size_t size)
{
    long s = seconds < 0 ? 0 : seconds > 359999 ? 359999 : (long)(seconds + 0.5);
    snprintf(out, size, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
}

/* the unit for an amount: kB below a megabyte, GB from ten gigabytes */
static double unit_of(double bytes, const char **name)
{
    *name = bytes < 1e6 ? "kB" : bytes < 1e10 ? "MB" : "GB";
    return bytes < 1e6 ? 1e3 : bytes < 1e10 ? 1e6 : 1e9;
}

void tr_progress_draw(struct tr_progress *p, int force)
{
    if (!p || !p->tty)
        return;
    double t = now();
    if (!force && t - p->last_draw < 0.1) /* at most ten redraws a second */
        return;
    p->last_draw = t;
    uint64_t done = tr_progress_done(p);
    double elapsed = t - p->start, rate = elapsed > 0 ? (double)done / elapsed : 0;
    const char *un, *ur;
    double u = unit_of((double)(p->total > done ? p->total : done), &un), ru = unit_of(rate, &ur);
    if (!p->total) { /* unknown size: amount and rate only */
        fprintf(stderr, "\r%s %.1f %s  %.1f %s/s ", p->label, (double)done / u, un, rate / ru, ur);
    } else {
        double frac = (double)done / (double)p->total;
        if (frac > 1)
            frac = 1;
        char bar[25], eta[32];
        int filled = (int)(frac * 24);
        for (int i = 0; i < 24; i++)
            bar[i] = i < filled ? '#' : ' ';
        bar[24] = '\0';
        if (rate > 0 && done < p->total)
            hms((double)(p->total - done) / rate, eta, sizeof eta);
        else
            snprintf(eta, sizeof eta, "%s", done >= p->total ? "0:00:00" : "?");
        fprintf(stderr, "\r%s %3d%% [%s] %.1f/%.1f %s  %.1f %s/s  ETA %s ", p->label,
                (int)(frac * 100), bar, (double)done / u, (double)p->total / u, un, rate / ru, ur,
                eta);
    }
    fflush(stderr);
    p->drawn = 1;
}

void tr_progress_end(struct tr_progress *p, int ok, int summary)
{
    if (!p)
        return;
    if (ok)
        tr_progress_draw(p, 1);
    if (p->drawn) {
        fputc('\n', stderr);
        double elapsed = tr_progress_elapsed(p);
        uint64_t done = tr_progress_done(p);
        double rate = elapsed > 0 ? (double)done / elapsed : 0;
        const char *un, *ur;
        double u = unit_of((double)done, &un), ru = unit_of(rate, &ur);
        if (ok && summary)
            fprintf(stderr, "%s: %.1f %s in %.2f s, %.1f %s/s\n", p->label, (double)done / u, un,
                    elapsed, rate / ru, ur);
    }
    free(p);
}
