/* The inputs of `prepare --format images`: image folders (one subdirectory per class, as
 * torchvision's ImageFolder; files sorted, hidden names left out) and WebDataset tar shards
 * (samples grouped by key: an image member .png/.jpg/.jpeg/.webp and a .cls label), each
 * sample queued on the run (prepare_images.c) with its class and its split. */
#include "dataset.h"

#include "prepare_images_internal.h"
#include "prepare_internal.h"

#include "../util/progress.h"
#include "../util/util.h"

#include <trainrun/input.h>
#include <archive.h>
#include <archive_entry.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static long class_index(const struct classes *c, const char *name)
{
    char *const *hit = c->n ? bsearch(&name, c->name, c->n, sizeof *c->name, cmp_str) : NULL;
    return hit ? (long)(hit - c->name) : -1;
}

static int has_image_ext(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot)
        return 0;
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".webp"};
    for (size_t i = 0; i < TR_ARRAY_LEN(ext); i++)
        if (strcasecmp(dot, ext[i]) == 0)
            return 1;
    return 0;
}

int images_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int read_file(const char *path, unsigned char **data, size_t *size)
{
    FILE *f = tr_input_fopen(path);
    if (!f)
        return tr_prepare_fail("cannot open %s: %s", path, tr_input_strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size > (off_t)MAX_MEMBER_BYTES) {
        fclose(f);
        return tr_prepare_fail("%s: %s", path,
                               errno ? strerror(errno) : "larger than 256 MiB: not an image "
                                                         "prepare decodes");
    }
    *size = (size_t)st.st_size;
    *data = malloc(*size ? *size : 1);
    if (!*data || fread(*data, 1, *size, f) != *size) {
        int e = errno;
        fclose(f);
        free(*data);
        return tr_prepare_fail("cannot read %s: %s", path, e ? strerror(e) : "short read");
    }
    fclose(f);
    return 0;
}

/* ---- folders ---------------------------------------------------------------- */

/* Entries of a directory, sorted by byte value (ImageFolder sorts its
 * classes and files with Python's sorted(), which is the same for UTF-8);
 * hidden names are left out.  NULL when it cannot be read. */
char **images_list_dir(const char *path, size_t *n)
{
    DIR *d = opendir(path);
    if (!d)
        return NULL;
    char **v = NULL;
    size_t cap = 0;
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(v, cap * sizeof *v);
            if (!grown)
                break;
            v = grown;
        }
        v[(*n)++] = tr_xasprintf("%s", e->d_name);
    }
    closedir(d);
    if (*n)
        qsort(v, *n, sizeof *v, cmp_str);
    return v ? v : tr_xcalloc(1, sizeof *v);
}

void images_free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* The class subdirectories of a folder input, added to r->cls (train) or
 * checked against it (val). */
int images_folder_classes(struct run *r, const char *root)
{
    size_t n;
    char **v = images_list_dir(root, &n);
    if (!v)
        return tr_prepare_fail("cannot read the folder %s: %s", root, strerror(errno));
    for (size_t i = 0; i < n; i++) {
        char *path = tr_xasprintf("%s/%s", root, v[i]);
        int dir = images_is_dir(path);
        free(path);
        if (!dir || class_index(&r->cls, v[i]) >= 0)
            continue;
        if (r->cls.n == r->cls.cap) {
            r->cls.cap = r->cls.cap ? 2 * r->cls.cap : 64;
            r->cls.name = realloc(r->cls.name, r->cls.cap * sizeof *r->cls.name);
            if (!r->cls.name) {
                images_free_list(v, n);
                return tr_prepare_fail("out of memory");
            }
        }
        r->cls.name[r->cls.n++] = tr_xasprintf("%s", v[i]);
        qsort(r->cls.name, r->cls.n, sizeof *r->cls.name, cmp_str);
    }
    images_free_list(v, n);
    return 0;
}

/* Every image file under dir (recursively, sorted), as class `label`.
 * rel is the path below the input root, for the split's hash. */
static int walk(struct run *r, const char *dir, const char *rel, uint32_t label, int val,
                int depth, uint64_t *found)
{
    if (depth > 32)
        return tr_prepare_fail("%s: folders nested more than 32 deep (a symbolic link loop?)",
                               dir);
    size_t n;
    char **v = images_list_dir(dir, &n);
    if (!v)
        return tr_prepare_fail("cannot read the folder %s: %s", dir, strerror(errno));
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *path = tr_xasprintf("%s/%s", dir, v[i]);
        char *sub = tr_xasprintf("%s/%s", rel, v[i]);
        if (images_is_dir(path)) {
            rc = walk(r, path, sub, label, val, depth + 1, found);
        } else if (!has_image_ext(v[i])) {
            if (r->ignored++ == 0)
                snprintf(r->first_ignored, sizeof r->first_ignored, "%s", path);
        } else {
            unsigned char *data = NULL;
            size_t size = 0;
            rc = read_file(path, &data, &size);
            if (rc == 0) {
                tr_progress_add(r->progress, size);
                rc = images_put_sample(r, path, sub, data, size, label, val);
                (*found)++;
            }
        }
        free(path);
        free(sub);
    }
    images_free_list(v, n);
    return rc;
}

int images_prepare_folder(struct run *r, const char *root, int val)
{
    size_t n;
    char **v = images_list_dir(root, &n);
    if (!v)
        return tr_prepare_fail("cannot read the folder %s: %s", root, strerror(errno));
    int rc = 0, classes = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *path = tr_xasprintf("%s/%s", root, v[i]);
        if (!images_is_dir(path)) {
            if (r->ignored++ == 0)
                snprintf(r->first_ignored, sizeof r->first_ignored, "%s", path);
            free(path);
            continue;
        }
        classes++;
        long label = class_index(&r->cls, v[i]);
        if (label < 0) /* only a validation folder can have a class the training ones lack */
            rc = tr_prepare_fail("%s: the validation folder has a class, '%s', that no training "
                                 "folder has; the classes are the training folders' "
                                 "subdirectories",
                                 path, v[i]);
        uint64_t found = 0;
        if (rc == 0)
            rc = walk(r, path, v[i], (uint32_t)label, val, 0, &found);
        if (rc == 0 && found == 0 && !val)
            rc = tr_prepare_fail("%s: the class folder holds no .png, .jpg, .jpeg or .webp "
                                 "file; add images or remove the folder (every subdirectory "
                                 "of %s is a class)",
                                 path, root);
        free(path);
    }
    images_free_list(v, n);
    if (rc == 0 && classes == 0)
        rc = tr_prepare_fail("%s has no subdirectories: an image folder holds one "
                             "subdirectory of images per class (root/cat/1.png, "
                             "root/dog/2.png), as torchvision's ImageFolder",
                             root);
    return rc;
}

struct sample {
    char key[1024];
    unsigned char *image;
    size_t image_size;
    char image_member[1024];
    long label;  /* -1: no .cls yet */
    char cls_problem[128];
};

static int flush_sample(struct run *r, const char *tar, struct sample *s, int val)
{
    int rc = 0;
    char where[2200];
    snprintf(where, sizeof where, "%s: sample %s", tar, s->key);
    if (!s->key[0])
        return 0;
    if (!s->image || s->label < 0) {
        /* the samples before it first, so that errors come in input order */
        rc = images_flush_batch(r);
        if (rc == 0)
            rc = images_bad_record(r, where, !s->image ? "no .png, .jpg, .jpeg or .webp member"
                                      : s->cls_problem[0] ? s->cls_problem
                                                          : "no .cls member (the class number)");
    } else {
        snprintf(where, sizeof where, "%s: %s", tar, s->image_member);
        rc = images_put_sample(r, where, s->key, s->image, s->image_size, (uint32_t)s->label, val);
        s->image = NULL; /* the batch's now */
    }
    free(s->image);
    memset(s, 0, sizeof *s);
    s->label = -1;
    return rc;
}

/* A tar member's WebDataset key (the path up to the first dot of the file name) into
 * key[1024] and its extension (*ext, the rest); 0 when the name has none (no dot, or a
 * hidden name): not a member of a sample. */
static int member_key(const char *name, char key[1024], const char **ext)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || base[0] == '.')
        return 0;
    snprintf(key, 1024, "%.*s", (int)(dot - name), name);
    *ext = dot + 1;
    return 1;
}

/* The current member's bytes (NUL-terminated, malloc'd) into *data, *size of them; a member
 * too large to be an image is a bad record (*data left NULL).  0 or -1. */
static int read_member(struct run *r, struct archive *a, struct archive_entry *e, const char *path,
                       const char *name, unsigned char **data, size_t *size_out)
{
    *data = NULL;
    int64_t size = archive_entry_size(e);
    char where[2200];
    snprintf(where, sizeof where, "%s: %s", path, name);
    if (size < 0 || size > (int64_t)MAX_MEMBER_BYTES)
        return images_bad_record(r, where, "larger than 256 MiB: not an image prepare decodes");
    unsigned char *d = malloc((size_t)size + 1);
    if (!d)
        return tr_prepare_fail("out of memory");
    la_ssize_t got = archive_read_data(a, d, (size_t)size);
    if (got != size) {
        free(d);
        return tr_prepare_fail("%s: %s (a truncated tar?)", where,
                               got < 0 ? archive_error_string(a) : "member ends early");
    }
    d[size] = '\0';
    *data = d;
    *size_out = (size_t)size;
    return 0;
}

/* A .cls member's text: the sample's class number, or why it is not one. */
static void take_cls(struct sample *s, const unsigned char *data)
{
    char *end;
    const char *t = (const char *)data;
    while (isspace((unsigned char)*t))
        t++;
    errno = 0;
    long v = strtol(t, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if (end == t || *end || errno || v < 0 || v >= TR_IMAGES_MAX_CLASSES)
        snprintf(s->cls_problem, sizeof s->cls_problem,
                 ".cls is not a class number from 0 to %d", TR_IMAGES_MAX_CLASSES - 1);
    else
        s->label = v;
}

/* One member: a new key flushes the sample before it; an image or a .cls is read into the
 * sample, other fields (.json, .txt, ...) are passed over.  0 or -1. */
static int take_member(struct run *r, struct archive *a, struct archive_entry *e, const char *path,
                       struct sample *s, int val)
{
    const char *name = archive_entry_pathname(e);
    char key[1024];
    const char *ext;
    if (archive_entry_filetype(e) != AE_IFREG || !name || !member_key(name, key, &ext))
        return 0;
    int rc;
    if (strcmp(key, s->key) != 0) {
        if ((rc = flush_sample(r, path, s, val)) != 0)
            return rc;
        snprintf(s->key, sizeof s->key, "%s", key);
    }
    int is_image = strcasecmp(ext, "png") == 0 || strcasecmp(ext, "jpg") == 0 ||
                   strcasecmp(ext, "jpeg") == 0 || strcasecmp(ext, "webp") == 0;
    int is_cls = strcasecmp(ext, "cls") == 0;
    if (!is_image && !is_cls)
        return 0; /* .json, .txt, ...: other fields of the sample */
    unsigned char *data;
    size_t size;
    if ((rc = read_member(r, a, e, path, name, &data, &size)) != 0 || !data)
        return rc;
    if (is_image) {
        free(s->image);
        s->image = data;
        s->image_size = size;
        snprintf(s->image_member, sizeof s->image_member, "%s", name);
        return 0;
    }
    take_cls(s, data);
    free(data);
    return 0;
}

int images_prepare_tar(struct run *r, const char *path, int val)
{
    struct archive *a = archive_read_new();
    archive_read_support_filter_all(a);
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK) {
        int rc = tr_prepare_fail("cannot open %s: %s", path, archive_error_string(a));
        archive_read_free(a);
        return rc;
    }
    struct sample s;
    memset(&s, 0, sizeof s);
    s.label = -1;
    int64_t consumed = 0;
    int rc = 0;
    for (;;) {
        struct archive_entry *e;
        int st = archive_read_next_header(a, &e);
        if (st == ARCHIVE_EOF)
            break;
        if (st < ARCHIVE_WARN) {
            rc = tr_prepare_fail("%s: %s (a damaged or truncated tar?)", path,
                                 archive_error_string(a));
            break;
        }
        int64_t now = archive_filter_bytes(a, -1);
        tr_progress_add(r->progress, (uint64_t)(now - consumed));
        consumed = now;
        if ((rc = take_member(r, a, e, path, &s, val)) != 0)
            break;
    }
    if (rc == 0)
        rc = flush_sample(r, path, &s, val);
    free(s.image);
    archive_read_free(a);
    return rc;
}
