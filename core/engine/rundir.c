/* One writer per run directory: rank 0 holds run_dir/trainrun.lock for as
 * long as it runs, and a fresh run refuses a directory that holds an
 * earlier one instead of mixing their metrics and checkpoints.  The run
 * directory also keeps the tokenizer that made the run's data
 * (run_dir/tokenizer.json, with the tokenizer_config.json beside it when
 * there is one, and where it came from in tokenizer.origin.json), so
 * `trainrun sample` turns the model's ids back into text long after the
 * data directory is gone. */
#include "rundir.h"

#include "../config/hf_config.h"
#include "../config/recipe.h"
#include "../config/record.h"
#include "../util/json.h"
#include "../tokenizer/tokenizer.h"

#include <trainrun/input.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The command line of this process, for the lock's note on who holds it. */
static void command_line(char *buf, size_t size)
{
    snprintf(buf, size, "trainrun");
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f)
        return;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i + 1 < n; i++) /* arguments are NUL-separated */
        if (!buf[i])
            buf[i] = ' ';
}

/* A name a run writes, replaces or removes in its directory: the files of
 * this file and journal.c, the checkpoints, the loggers' defaults. */
static int run_writes(const char *name)
{
    static const char *const exact[] = {
        "tokenizer.json", "tokenizer_config.json", "tokenizer.origin.json", "trace.json",
        "recipe.resolved", "recipe.resolved.json", "metrics.jsonl", "metrics.csv",
        "checkpoints", "tb", NULL};
    static const char *const prefix[] = {"trace-", "recipe.resolved.", NULL};
    for (int i = 0; exact[i]; i++)
        if (strcmp(name, exact[i]) == 0)
            return 1;
    for (int i = 0; prefix[i]; i++)
        if (strncmp(name, prefix[i], strlen(prefix[i])) == 0)
            return 1;
    return 0;
}

/* A directory holds a trainrun run when a run has locked it or written its
 * record, metrics or a checkpoint there (runs of an older trainrun have no
 * lock file). */
static int holds_a_run(const char *dir)
{
    static const char *const marks[] = {"trainrun.lock", "metrics.jsonl", "recipe.resolved.json",
                                        "checkpoints/LATEST", NULL};
    for (int i = 0; marks[i]; i++) {
        char *path = tr_xasprintf("%s/%s", dir, marks[i]);
        struct stat st;
        int found = lstat(path, &st) == 0;
        free(path);
        if (found)
            return 1;
    }
    return 0;
}

/* An existing directory that holds no run but files with the names a run
 * writes (a Hugging Face model directory named by a typo or a shared
 * recipe: its tokenizer.json, tokenizer_config.json, ...) is refused before
 * anything is written there: the run would replace or remove them.  Files
 * with other names are never touched, so a directory that holds only those
 * (a log the shell redirects there) is fine. */
static int refuse_foreign(const char *dir, tr_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return TR_OK; /* none yet: tr_mkdir_p makes it, or says why not */
    if (holds_a_run(dir)) {
        closedir(d);
        return TR_OK;
    }
    char found[512] = "";
    size_t len = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!run_writes(e->d_name))
            continue;
        if (n++ < 4)
            len += (size_t)snprintf(found + len, len < sizeof found ? sizeof found - len : 0,
                                    "%s%s", n > 1 ? ", " : "", e->d_name);
        if (len >= sizeof found)
            len = sizeof found - 1;
    }
    closedir(d);
    if (n == 0)
        return TR_OK;
    return tr_fail(err, "run_dir %s is not a trainrun run directory, but it holds %s%s, which a "
                   "run would overwrite or remove: give the run a directory of its own "
                   "(run_dir=..., a new or an empty one); nothing was written to %s",
                   dir, found, n > 4 ? " and more" : "", dir);
}

/* run_dir/trainrun.lock is flock()ed by the one process that writes the run
 * (rank 0) for as long as it runs.  The kernel drops a flock when its holder
 * ends, however it ends, so a crash or a SIGKILL leaves nothing stuck; the
 * file's text only names the holder for the message a second process gets.
 * Readers (report, export, sample) take no lock. */
int tr_rundir_lock(const struct tr_config *cfg, struct tr_rundir_lock *lock, tr_err *err)
{
    const char *dir = cfg->run_dir;
    if (refuse_foreign(dir, err) != TR_OK)
        return TR_ERROR;
    if (tr_mkdir_p(dir) != 0)
        return tr_fail(err, "cannot create the run directory %s: %s", dir, strerror(errno));
    char *path = tr_xasprintf("%s/trainrun.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        int rc = tr_fail(err, "cannot create %s: %s; check the permissions of %s or set run_dir=",
                         path, strerror(errno), dir);
        free(path);
        return rc;
    }
    /* a holder killed a moment ago (a job restarted right after kill -9)
     * may still be exiting: its lock goes with it within milliseconds, so
     * try for a second before naming it */
    int e = 0;
    for (int tries = 0;; tries++) {
        e = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
        if (e != EWOULDBLOCK || tries == 19)
            break;
        usleep(50 * 1000);
    }
    if (e != 0) {
        if (e == EWOULDBLOCK) {
            char holder[1024];
            ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = 0;
            holder[strcspn(holder, "\n")] = 0;
            close(fd);
            free(path);
            return tr_fail(err, "run directory %s is in use by another trainrun (%s); wait for it "
                           "to finish or stop it, or give this run its own directory (run_dir=...)",
                           dir, *holder ? holder : "its details are not written yet");
        }
        /* a file system without locks (some network mounts): run unguarded */
        tr_log(TR_LOG_WARN, NULL, "cannot lock %s: %s; nothing stops a second run from writing "
               "to %s at the same time", path, strerror(e), dir);
        close(fd);
        free(path);
        return TR_OK;
    }
    char host[256] = "?", started[64] = "?", cmd[512];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S UTC", &tm);
    command_line(cmd, sizeof cmd);
    char *note = tr_xasprintf("pid %ld on %s, started %s: %s\n", (long)getpid(), host, started, cmd);
    /* the note is a courtesy: failing to write it does not stop the run */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, note, strlen(note), 0) < 0)
        tr_log(TR_LOG_WARN, NULL, "cannot write %s: %s", path, strerror(errno));
    free(note);
    free(path);
    lock->fd = fd;
    lock->held = 1;
    return TR_OK;
}

/* A fresh start in a run directory that holds an earlier run would cut its
 * metrics.jsonl and write new checkpoints among its old ones (a later
 * --resume auto would then pick the newest of either run): refuse, and say
 * how to continue it or where else to start. */
int tr_rundir_refuse_earlier(const struct tr_config *cfg, tr_err *err)
{
    char *path = tr_xasprintf("%s/metrics.jsonl", cfg->run_dir);
    struct stat st;
    int used = stat(path, &st) == 0 && st.st_size > 0;
    free(path);
    if (!used)
        return TR_OK;
    const char *dir = cfg->run_dir;
    return tr_fail(err, "%s holds an earlier run (%s/metrics.jsonl and its checkpoints): continue "
                   "it with --resume auto, or start this one in a directory of its own "
                   "(run_dir=...); to start over here, remove %s first", dir, dir, dir);
}

void tr_rundir_unlock(struct tr_rundir_lock *lock)
{
    if (!lock->held)
        return;
    close(lock->fd); /* releases the lock */
    lock->held = 0;
}

/* ---- the run's tokenizer ---------------------------------------------------- */

/* A whole file into memory (NUL-terminated); NULL with errno set. */
static char *read_whole(const char *path, size_t *size)
{
    FILE *f = tr_input_fopen(path);
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? 2 * cap : 65536;
            buf = tr_xrealloc(buf, cap + 1);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    *size = n;
    return buf;
}

/* The 64-bit FNV-1a of the bytes, as `prepare` records a tokenizer's hash. */
static uint64_t fnv1a64(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return h;
}

/* Write bytes to path so that readers see all of them or none: a temporary
 * file beside it, synced, then renamed over it.  0 or -1 with errno. */
static int write_atomically(const char *path, const char *data, size_t size)
{
    char *tmp = tr_xasprintf("%s.tmp-%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        free(tmp);
        return -1;
    }
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    int e = done < size ? (errno ? errno : EIO) : 0;
    if (!e && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e)
        unlink(tmp);
    free(tmp);
    errno = e;
    return e ? -1 : 0;
}

/* The EOS `prepare` put after each document with the tokenizer src: the
 * "eos" of the "tokenizer" in the prepare.json beside it (--eos, or its
 * own choice); -1 when it is not known or there was none. */
static int32_t prepared_eos(const char *src)
{
    char *src_dir = tr_dirname(src);
    char *path = tr_xasprintf("%s/prepare.json", src_dir);
    size_t size = 0;
    char *text = read_whole(path, &size);
    struct tr_json *j = text ? tr_json_parse(text, size, NULL) : NULL;
    const struct tr_json *tok = j && j->type == TR_JSON_OBJECT ? tr_json_get(j, "tokenizer") : NULL;
    const struct tr_json *eos = tok && tok->type == TR_JSON_OBJECT ? tr_json_get(tok, "eos") : NULL;
    int32_t id = eos && eos->type == TR_JSON_NUMBER && eos->number >= 0 && eos->number < INT32_MAX &&
                         eos->number == (double)(int32_t)eos->number
                     ? (int32_t)eos->number : -1;
    tr_json_free(j);
    free(text);
    free(path);
    free(src_dir);
    return id;
}

/* The tokenizer the data reports, else model.from's DIR/tokenizer.json,
 * else NULL; newly allocated.  *from_model says which. */
static char *data_or_model_tokenizer(const struct tr_session *s, int *from_model)
{
    *from_model = 0;
    if (s->data.info.tokenizer && *s->data.info.tokenizer)
        return tr_xstrdup(s->data.info.tokenizer);
    const char *dir = tr_hf_from_dir(s->cfg->recipe);
    if (!dir)
        return NULL;
    char *path = tr_xasprintf("%s/tokenizer.json", dir);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        *from_model = 1;
        return path;
    }
    free(path);
    return NULL;
}

/* The ids the model reads and predicts: the token embedding's rows, or
 * the logits' width when that is smaller; UINT64_MAX when it has neither. */
static uint64_t model_vocab(const struct tr_graph *g)
{
    uint64_t vocab = UINT64_MAX;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TR_OP_EMBEDDING && g->nodes[i].in[1] == g->inputs[0])
            vocab = (uint64_t)g->tensors[g->nodes[i].in[0]].shape[0];
    if (g->logits >= 0) {
        const struct tr_tensor *lg = &g->tensors[g->logits];
        if ((uint64_t)lg->shape[lg->ndim - 1] < vocab)
            vocab = (uint64_t)lg->shape[lg->ndim - 1];
    }
    return vocab;
}

/* The file:line of a recipe key, for messages. */
static void key_where(const struct tr_config *cfg, const char *key, char *where, size_t size)
{
    struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(cfg->recipe), 0};
    tr_recipe_origin(cfg->recipe, key, &o);
    tr_origin_format(&o, where, size);
}

/* Byte ids (text with no tokenizer, a token a byte at most, none of 256 or
 * more) fed to a model = { from = DIR } whose DIR/tokenizer.json made its
 * vocabulary: every byte would be read as one of that tokenizer's tokens,
 * and the loss would measure nothing.  Ids that are not text (synthetic,
 * for a benchmark) pass. */
static int check_byte_data(const struct tr_config *cfg, const char *data_name,
                           const struct tr_data_info *di, uint64_t vocab, tr_err *err)
{
    const char *dir = tr_hf_from_dir(cfg->recipe);
    double bpt = di->bytes_per_token[TR_SPLIT_TRAIN];
    if (!dir || (di->tokenizer && *di->tokenizer) || di->input_dtype != TR_I32 ||
        di->classes == 0 || di->classes > 256 || vocab <= 256 || !(bpt > 0 && bpt <= 1.0))
        return TR_OK;
    char *path = tr_xasprintf("%s/tokenizer.json", dir);
    struct stat st;
    int has = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    int rc = TR_OK;
    if (has) {
        char where[600];
        tr_origin_format(&cfg->data.origin, where, sizeof where);
        rc = tr_fail(err, "%s: data '%s' gives byte ids (0 to %u, no tokenizer), but model.from's "
                     "weights (%s, a vocabulary of %llu) were trained on the ids of %s: the model "
                     "would read each byte as another token and its loss would mean nothing; "
                     "tokenize the text with the model's tokenizer (`trainrun prepare FILE -o DIR "
                     "--tokenizer %s`) and read it with data = { plugin = \"tokens\", train = "
                     "\"DIR/train_*.bin\", val = \"DIR/val_*.bin\" }", where, data_name,
                     di->classes - 1, dir, (unsigned long long)vocab, path, path);
    }
    free(path);
    return rc;
}

int tr_check_data_tokenizer(const struct tr_config *cfg, const struct tr_graph *g,
                            const char *data_name, const struct tr_data_info *di, int rank,
                            tr_err *err)
{
    uint64_t model = model_vocab(g);
    if (check_byte_data(cfg, data_name, di, model, err) != TR_OK)
        return TR_ERROR;
    const char *path = di->tokenizer;
    if (!path || !*path)
        return TR_OK;
    size_t size = 0;
    char *text = read_whole(path, &size);
    if (!text)
        return tr_fail(err, "data '%s': cannot read its tokenizer %s: %s", data_name, path,
                       tr_input_strerror(errno));
    tr_err why = {{0}};
    struct tr_tokenizer *tok = tr_tokenizer_parse(text, size, path, &why);
    if (tok) {
        size_t tv = tr_tokenizer_vocab_size(tok);
        tr_tokenizer_free(tok);
        if (model < tv) {
            free(text);
            char where[600];
            key_where(cfg, "model.vocab", where, sizeof where);
            return tr_fail(err, "%s: the model's vocabulary of %llu tokens is smaller than the "
                           "%zu ids of the tokenizer that made the data (%s): ids it produces "
                           "would index past the token embedding; set model.vocab=%zu (or more)",
                           where, (unsigned long long)model, tv, path, tv);
        }
    } else if (rank == 0) {
        /* training needs only the ids; sample will say the same when it decodes */
        tr_log(TR_LOG_WARN, NULL, "the data's tokenizer %s cannot be read here (%s); its vocabulary "
               "is not checked against the model's", path, why.msg);
    }
    const char *dir = tr_hf_from_dir(cfg->recipe);
    char *theirs_path = dir ? tr_xasprintf("%s/tokenizer.json", dir) : NULL;
    size_t theirs_size = 0;
    char *theirs = theirs_path ? read_whole(theirs_path, &theirs_size) : NULL;
    int differ = theirs && (theirs_size != size || memcmp(theirs, text, size) != 0);
    int rc = TR_OK;
    if (differ) {
        char where[600];
        key_where(cfg, "model.from", where, sizeof where);
        /* the advice must be one that works: preparing with the model's file needs a file
         * this trainrun reads */
        tr_err bad = {{0}};
        struct tr_tokenizer *ours = tr_tokenizer_parse(theirs, theirs_size, theirs_path, &bad);
        char advice[1400];
        if (ours)
            snprintf(advice, sizeof advice, "re-prepare the data with `trainrun prepare ... "
                     "--tokenizer %s`", theirs_path);
        else
            snprintf(advice, sizeof advice, "this trainrun cannot prepare data with %s (%s); "
                     "if %s gives the same ids for every text (a copy changed only where trainrun "
                     "could not read the original), keep the original aside and put that copy in "
                     "its place as %s, else use a trainrun that reads it", theirs_path, bad.msg,
                     path, theirs_path);
        tr_tokenizer_free(ours);
        rc = tr_fail(err, "%s: model.from: the weights in %s were trained with the tokenizer %s "
                     "(hash %016llx), but data '%s' was made with another one, %s (hash %016llx): "
                     "the model would read the data's ids as other tokens; %s", where, dir,
                     theirs_path, (unsigned long long)fnv1a64(theirs, theirs_size), data_name,
                     path, (unsigned long long)fnv1a64(text, size), advice);
    }
    free(theirs);
    free(theirs_path);
    free(text);
    return rc;
}

int tr_rundir_check_tokenizer(const struct tr_session *s, tr_err *err)
{
    return tr_check_data_tokenizer(s->cfg, s->g, s->data.name, &s->data.info, s->rank, err);
}

/* tokenizer_config.json beside the tokenizer src (its eos_token and chat
 * template) into run_dir, or none there when src has none.  0 or -1 with
 * errno. */
static int record_config(const char *src, const char *dir)
{
    char *src_dir = tr_dirname(src);
    char *from = tr_xasprintf("%s/tokenizer_config.json", src_dir);
    char *to = tr_xasprintf("%s/tokenizer_config.json", dir);
    size_t size = 0;
    char *text = read_whole(from, &size);
    int rc = text ? write_atomically(to, text, size) : unlink(to) == 0 || errno == ENOENT ? 0 : -1;
    free(text);
    free(src_dir);
    free(from);
    free(to);
    return rc;
}

/* Rank 0 at the start of a run (also a resumed one): the tokenizer the data
 * was made with (else model.from's) into run_dir/tokenizer.json, atomically,
 * with the tokenizer_config.json beside it when there is one, and where it
 * came from into run_dir/tokenizer.origin.json.  A resumed run
 * whose tokenizer.json differs from its data's is refused: its checkpoints
 * learnt the other tokenizer's ids.  A fresh run with no tokenizer removes
 * one an earlier attempt in the directory recorded (with its
 * tokenizer.origin.json), so sample never decodes with a tokenizer the
 * model did not learn. */
int tr_rundir_record_tokenizer(const struct tr_session *s, int resume, tr_err *err)
{
    const char *dir = s->cfg->run_dir;
    char *dst = tr_xasprintf("%s/tokenizer.json", dir);
    char *origin = tr_xasprintf("%s/tokenizer.origin.json", dir);
    int from_model = 0, rc = TR_OK;
    char *src = data_or_model_tokenizer(s, &from_model);
    size_t size = 0, had_size = 0;
    char *text = NULL, *had = read_whole(dst, &had_size);
    if (!had && errno != ENOENT) {
        rc = tr_fail(err, "cannot read %s: %s; remove it, or start a new run (run_dir=...)", dst,
                     tr_input_strerror(errno));
        goto out;
    }
    if (!src) {
        char *config = tr_xasprintf("%s/tokenizer_config.json", dir);
        /* only a tokenizer this trainrun recorded (its origin note beside it):
         * another tool's tokenizer.json is not ours to remove */
        struct stat st;
        if (had && !resume && stat(origin, &st) == 0 &&
            (unlink(dst) != 0 || unlink(origin) != 0 ||
             (unlink(config) != 0 && errno != ENOENT)))
            rc = tr_fail(err, "cannot remove %s, which an earlier run left: %s; remove it (this "
                         "run's data has no tokenizer)", dst, strerror(errno));
        free(config);
        goto out;
    }
    if (!(text = read_whole(src, &size))) {
        rc = tr_fail(err, "cannot read the tokenizer %s: %s", src, tr_input_strerror(errno));
        goto out;
    }
    if (had && resume && (had_size != size || memcmp(had, text, size) != 0)) {
        rc = tr_fail(err, "%s (hash %016llx) is not the tokenizer this run's %s was made with, %s "
                     "(hash %016llx): the checkpoints learnt the ids of the first; resume with "
                     "the data made by %s, or start a new run (run_dir=...)", dst,
                     (unsigned long long)fnv1a64(had, had_size),
                     from_model ? "model.from" : "data", src,
                     (unsigned long long)fnv1a64(text, size), dst);
        goto out;
    }
    char real[PATH_MAX];
    const char *shown = realpath(src, real) ? real : src;
    char *note = NULL;
    size_t note_len = 0;
    FILE *f = open_memstream(&note, &note_len);
    if (!f) {
        rc = tr_fail(err, "out of memory");
        goto out;
    }
    fputs("{\"file\": \"tokenizer.json\", \"source\": ", f);
    tr_json_write_string(f, shown);
    fprintf(f, ", \"hash\": \"%016llx\", \"bytes\": %zu, \"from\": \"%s\"",
            (unsigned long long)fnv1a64(text, size), size, from_model ? "model.from" : "data");
    int32_t eos = prepared_eos(src);
    if (eos >= 0) /* sample stops there */
        fprintf(f, ", \"eos\": %d", (int)eos);
    fputs("}\n", f);
    fclose(f);
    if ((!had || had_size != size || memcmp(had, text, size) != 0) &&
        write_atomically(dst, text, size) != 0)
        rc = tr_fail(err, "cannot write %s: %s; check the permissions of %s or set run_dir=", dst,
                     strerror(errno), dir);
    else if (write_atomically(origin, note, note_len) != 0)
        rc = tr_fail(err, "cannot write %s: %s; check the permissions of %s or set run_dir=",
                     origin, strerror(errno), dir);
    else if (record_config(src, dir) != 0)
        rc = tr_fail(err, "cannot write %s/tokenizer_config.json: %s; check the permissions of "
                     "%s or set run_dir=", dir, strerror(errno), dir);
    else
        tr_log(TR_LOG_INFO, NULL, "tokenizer %s (from the %s) recorded as %s", shown,
               from_model ? "model.from directory" : "data", dst);
    free(note);
out:
    free(src);
    free(text);
    free(had);
    free(dst);
    free(origin);
    return rc;
}

/* ---- the run's record of its recipe ------------------------------------------ */

/* One of the run's record files, whole, or NULL (errno ENOENT: none). */
static char *memstream_of(const struct tr_config *cfg, int json, size_t *size)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, size);
    if (!f)
        return NULL;
    if (json)
        tr_record_write_json(cfg, f);
    else
        tr_record_print(cfg, f);
    fclose(f);
    return text;
}

/* Keep the record a changed resume replaces: recipe.resolved.N.json and
 * recipe.resolved.N, N the first number free, so the run directory says what
 * ran when (each record's steps are in metrics.jsonl between the resumes). */
static int keep_earlier_record(const char *dir, tr_err *err)
{
    for (int n = 1; n < 100000; n++) {
        char *json = tr_xasprintf("%s/recipe.resolved.%d.json", dir, n);
        struct stat st;
        if (stat(json, &st) == 0) {
            free(json);
            continue;
        }
        char *from_json = tr_xasprintf("%s/recipe.resolved.json", dir);
        char *from_text = tr_xasprintf("%s/recipe.resolved", dir);
        char *text = tr_xasprintf("%s/recipe.resolved.%d", dir, n);
        int rc = TR_OK;
        if (rename(from_json, json) != 0 || (rename(from_text, text) != 0 && errno != ENOENT))
            rc = tr_fail(err, "cannot keep the earlier recipe record %s as %s: %s", from_json,
                         json, strerror(errno));
        free(from_json);
        free(from_text);
        free(text);
        free(json);
        return rc;
    }
    return tr_fail(err, "%s: too many earlier recipe records (recipe.resolved.N.json)", dir);
}

/* Rank 0 at the start of a run, after resuming (`resumed`: from a
 * checkpoint): the resolved recipe into run_dir/recipe.resolved and
 * recipe.resolved.json (record.h), atomically.  A resumed run compares its
 * recipe with the recorded one first: a change that alters training is
 * refused, listing each, unless allow_changes; harmless changes are noted.
 * When the record changes, the earlier one is kept as recipe.resolved.N. */
int tr_rundir_record_recipe(const struct tr_config *cfg, int resumed, int allow_changes,
                            tr_err *err)
{
    const char *dir = cfg->run_dir;
    char *json_path = tr_xasprintf("%s/recipe.resolved.json", dir);
    char *text_path = tr_xasprintf("%s/recipe.resolved", dir);
    size_t json_size = 0, text_size = 0, old_size = 0;
    char *json = memstream_of(cfg, 1, &json_size);
    char *text = memstream_of(cfg, 0, &text_size);
    char *old = read_whole(json_path, &old_size);
    int old_errno = errno;
    char *altering = NULL, *harmless = NULL;
    int rc = TR_ERROR;
    if (!json || !text) {
        tr_fail(err, "out of memory writing %s", json_path);
        goto out;
    }
    if (!old && old_errno != ENOENT) {
        tr_fail(err, "cannot read %s: %s; replace it with the run's record or start a new run "
                "(run_dir=...)", json_path, tr_input_strerror(old_errno));
        goto out;
    }
    if (old && resumed) {
        if (tr_record_compare(cfg, old, old_size, json_path, &altering, &harmless, err) != TR_OK)
            goto out;
        if (altering && !allow_changes) {
            tr_fail(err, "the recipe differs from the one this run was trained with (%s) in what "
                    "it trains:\n%s"
                    "resume with the recorded values, or add --allow-changes to continue with "
                    "these (both records are kept), or start a new run (run_dir=...)",
                    json_path, altering);
            goto out;
        }
        /* the lists end in a newline that the log line adds itself */
        if (altering)
            tr_log(TR_LOG_WARN, NULL, "resuming with changes that alter training "
                   "(--allow-changes; the earlier record is kept beside %s):\n%.*s", json_path,
                   (int)strlen(altering) - 1, altering);
        if (harmless)
            tr_log(TR_LOG_INFO, NULL, "note: resuming with changes that do not alter "
                   "training:\n%.*s", (int)strlen(harmless) - 1, harmless);
        if (old_size != json_size || memcmp(old, json, json_size) != 0)
            if (keep_earlier_record(dir, err) != TR_OK)
                goto out;
    } else if (!old && resumed) {
        tr_log(TR_LOG_INFO, NULL, "note: %s has no recipe record (a run of an older trainrun): "
               "recording this one, nothing to compare with", dir);
    }
    if (write_atomically(json_path, json, json_size) != 0 ||
        write_atomically(text_path, text, text_size) != 0) {
        tr_fail(err, "cannot write %s: %s", json_path, strerror(errno));
        goto out;
    }
    rc = TR_OK;
out:
    free(altering);
    free(harmless);
    free(old);
    free(json);
    free(text);
    free(json_path);
    free(text_path);
    return rc;
}
