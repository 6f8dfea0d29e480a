/*
 * The lines of a CSV file as the csv data source reads them: one line at a
 * time from a plain or gzip'd file (zlib), fields split at commas and
 * trimmed of spaces and tabs, numbers as strtod reads them (finite only).
 *
 * Two readers share it, so they cannot drift apart: the csv plugin, and
 * `trainrun prepare --format csv`, whose job is to check and clean a file
 * so that the plugin takes it.  Include it to read CSV exactly as the csv
 * plugin does.  Header-only: a plugin that includes it links nothing of
 * trainrun (only zlib).
 *
 *   tr_csv_read_line(f, &buf, &cap)   the next line, without its ending
 *   tr_csv_is_blank(s)                only spaces and tabs
 *   tr_csv_trim(s)                    s without leading/trailing spaces, tabs
 *   tr_csv_split(line, &f, &cap)      fields at commas, in place, trimmed
 *   tr_csv_number(s, &v)              the whole field is one finite number
 */
#ifndef TRAINRUN_CSV_H
#define TRAINRUN_CSV_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* One line into *buf (grown as needed), without the line ending.  Returns
 * 1 for a line, 0 at end of file, -1 when out of memory. */
static inline int tr_csv_read_line(gzFile f, char **buf, size_t *cap)
{
    size_t len = 0;
    for (;;) {
        if (*cap - len < 2) {
            size_t grown = *cap ? *cap * 2 : 4096;
            char *p = realloc(*buf, grown);
            if (!p)
                return -1;
            *buf = p;
            *cap = grown;
        }
        if (!gzgets(f, *buf + len, (int)(*cap - len > INT_MAX ? INT_MAX : *cap - len))) {
            if (len == 0)
                return 0;
            break; /* last line without a newline */
        }
        len += strlen(*buf + len);
        if (len > 0 && (*buf)[len - 1] == '\n')
            break;
    }
    while (len > 0 && ((*buf)[len - 1] == '\n' || (*buf)[len - 1] == '\r'))
        len--;
    (*buf)[len] = '\0';
    return 1;
}

static inline int tr_csv_is_blank(const char *s)
{
    return s[strspn(s, " \t")] == '\0';
}

static inline char *tr_csv_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    return s;
}

/* Split a line at commas in place, each field trimmed, into *fields (grown
 * as needed); returns the number of fields, or (size_t)-1 when out of
 * memory. */
static inline size_t tr_csv_split(char *line, char ***fields, size_t *cap)
{
    size_t n = 0;
    char *p = line;
    for (;;) {
        if (n == *cap) {
            size_t grown = *cap ? *cap * 2 : 64;
            char **f = realloc(*fields, grown * sizeof *f);
            if (!f)
                return (size_t)-1;
            *fields = f;
            *cap = grown;
        }
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        (*fields)[n++] = tr_csv_trim(p);
        if (!comma)
            return n;
        p = comma + 1;
    }
}

/* The whole field is one finite number. */
static inline int tr_csv_number(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

#endif
