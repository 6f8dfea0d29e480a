/*
 * tfevents_check EVENTS METRICS_JSONL: a run's TensorBoard event file holds
 * what its metrics.jsonl holds.  Read with tests/tfevents.h (framing, both
 * CRCs, the Event and Summary fields), every metrics.jsonl line's loss, lr,
 * grad_norm, tokens_per_s, val_loss (and val_loss_per_byte when present)
 * must be in an Event of the same step, equal as a float to the printed
 * %.6g value within its rounding, and the event file may hold no step the
 * jsonl lacks.  Prints what it compared; exit 1 naming the first difference.
 * tests/e2e/logger.sh runs it.
 */
#include "tfevents.h"

#include <math.h>

static const char *const keys[] = {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss",
                                   "val_loss_per_byte", "val_accuracy"};

/* the number after "key": in a jsonl line; 0 when absent */
static int json_number(const char *line, const char *key, double *out)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(line, pat);
    if (!at)
        return 0;
    char *end;
    *out = strtod(at + strlen(pat), &end);
    return end != at + strlen(pat);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tfevents_check EVENTS METRICS_JSONL\n");
        return 2;
    }
    struct tfe_file f;
    char msg[512];
    if (tfevents_read(argv[1], &f, msg, sizeof msg) != 0) {
        fprintf(stderr, "FAIL: %s\n", msg);
        return 1;
    }
    if (!f.version_ok) {
        fprintf(stderr, "FAIL: %s: the first Event is not file_version brain.Event:2\n", argv[1]);
        return 1;
    }
    FILE *in = fopen(argv[2], "r");
    if (!in) {
        fprintf(stderr, "FAIL: cannot open %s\n", argv[2]);
        return 1;
    }
    char line[4096];
    size_t compared = 0, lines = 0;
    char *matched = calloc(f.n + 1, 1);
    while (fgets(line, sizeof line, in)) {
        double step;
        if (!json_number(line, "step", &step))
            continue;
        lines++;
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            double want;
            if (!json_number(line, keys[k], &want) || want < 0) /* -1: not known */
                continue;
            size_t i = 0;
            while (i < f.n && !((double)f.v[i].step == step && strcmp(f.v[i].tag, keys[k]) == 0 &&
                                !matched[i]))
                i++;
            if (i == f.n) {
                fprintf(stderr, "FAIL: %s has no %s at step %.0f (metrics.jsonl: %g)\n", argv[1],
                        keys[k], step, want);
                return 1;
            }
            matched[i] = 1;
            /* jsonl prints %.6g (tokens_per_s %.1f): half a unit of its last digit */
            double tol = strcmp(keys[k], "tokens_per_s") == 0 ? 0.05 + 1e-6 * fabs(want)
                                                              : 5e-6 * fabs(want) + 1e-12;
            if (fabs((double)f.v[i].value - want) > tol + 1e-7 * fabs(want)) {
                fprintf(stderr, "FAIL: step %.0f %s: event file %.9g, metrics.jsonl %.9g\n", step,
                        keys[k], (double)f.v[i].value, want);
                return 1;
            }
            compared++;
        }
    }
    fclose(in);
    /* nothing logged to TensorBoard that metrics.jsonl lacks a step for */
    for (size_t i = 0; i < f.n; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof keys / sizeof *keys && !known; k++)
            known = strcmp(f.v[i].tag, keys[k]) == 0;
        if (known && !matched[i]) {
            fprintf(stderr, "FAIL: %s: %s at step %lld is not in metrics.jsonl\n", argv[1],
                    f.v[i].tag, (long long)f.v[i].step);
            return 1;
        }
    }
    printf("tfevents_check: %zu events, %zu scalars; %zu values of %zu metrics.jsonl lines equal\n",
           f.events, f.n, compared, lines);
    free(matched);
    free(f.v);
    return compared > 0 ? 0 : 1;
}
