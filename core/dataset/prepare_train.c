/*
 * `trainrun prepare --train-tokenizer N` (see dataset.h): a byte-level BPE of
 * N tokens (core/tokenizer/bpe_train.h) trained on the kept training documents,
 * never on the validation ones, written as OUTDIR/tokenizer.json; the
 * tokenizer.json path of prepare_text.c then encodes every document with it,
 * as with --tokenizer FILE.
 */
#include "dataset.h"

#include "dedup.h"
#include "prepare_internal.h"

#include "../tokenizer/bpe_train.h"
#include "../util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tr_prepare_train_tokenizer(const char *out_dir, uint64_t vocab, const struct docs *d,
                               size_t to, const char *const *inputs)
{
    double t0 = tr_now();
    tr_err err = {{0}};
    struct tr_bpe_trainer *b = tr_bpe_trainer_new(&err);
    if (!b)
        return tr_prepare_fail("%s", err.msg);
    int rc = 0;
    for (size_t i = 0; i < to && rc == 0; i++) {
        const struct doc *doc = &d->v[i];
        if (doc->removed)
            continue;
        if (tr_bpe_trainer_feed(b, (const char *)doc->text, doc->len, &err) != TR_OK)
            rc = tr_prepare_fail("%s:%ld: %s; a tokenizer is trained on UTF-8 text: convert the "
                                 "input (iconv -t UTF-8) or leave out --train-tokenizer",
                                 inputs[doc->input], doc->line, err.msg);
    }
    char *json = NULL;
    size_t len = 0;
    struct tr_bpe_stats st;
    static const char *const specials[] = {TR_BPE_EOS};
    if (rc == 0 && tr_bpe_trainer_train(b, (size_t)vocab, 0, specials, 1, &json, &len, &st, &err) != TR_OK)
        rc = tr_prepare_fail("--train-tokenizer: %s", err.msg);
    tr_bpe_trainer_free(b);
    if (rc != 0)
        return rc;

    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(json);
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    }
    int short_write = fwrite(json, 1, len, f) != len;
    free(json);
    if (short_write) {
        fclose(f);
        unlink(tmp);
        return tr_prepare_fail("cannot write %s: %s", tmp, strerror(errno));
    }
    if (tr_prepare_publish(tmp, path, f) != 0)
        return -1;
    /* a tokenizer_config.json left by an earlier --tokenizer run belongs to another
     * tokenizer: the EOS would be looked up there */
    char config[4200];
    struct stat sb;
    snprintf(config, sizeof config, "%s/tokenizer_config.json", out_dir);
    if (lstat(config, &sb) == 0 && S_ISREG(sb.st_mode))
        unlink(config);

    printf("trainrun prepare: trained a byte-level BPE of %zu tokens (%zu merges, EOS %s) on "
           "%llu training documents (%llu bytes, %llu words, %zu distinct) in %.2f s: %s\n",
           st.vocab, st.merges, TR_BPE_EOS, (unsigned long long)st.documents,
           (unsigned long long)st.bytes, (unsigned long long)st.words, st.unique_words,
           tr_now() - t0, path);
    if (st.vocab < vocab)
        printf("trainrun prepare: note: the text had no more pairs to merge, so the vocabulary "
               "is %zu, not %llu\n", st.vocab, (unsigned long long)vocab);
    return 0;
}
