#include "doctor.h"

#include "../engine/backend.h"
#include "../engine/topo.h"
#include "../util/util.h"

#include <dirent.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- CPU ---------------------------------------------------------------- */

struct cpu_features {
    char model[49];
    int x86;
    int avx, avx2, fma, f16c, avx512f, avx512_bf16, amx_tile, amx_bf16;
    int os_avx, os_avx512, os_amx; /* the OS saves the registers (XCR0) */
};

static void cpu_probe(struct cpu_features *f)
{
    memset(f, 0, sizeof *f);
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    f->x86 = 1;
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
        unsigned *words = (unsigned *)f->model;
        for (unsigned leaf = 0; leaf < 3; leaf++) {
            __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
            words[leaf * 4 + 0] = a;
            words[leaf * 4 + 1] = b;
            words[leaf * 4 + 2] = c;
            words[leaf * 4 + 3] = d;
        }
        f->model[48] = 0;
    }
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 1 && __get_cpuid(1, &a, &b, &c, &d)) {
        f->fma = (c >> 12) & 1;
        f->f16c = (c >> 29) & 1;
        f->avx = (c >> 28) & 1;
        if ((c >> 27) & 1) { /* OSXSAVE: XCR0 says which register files the OS saves */
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            f->os_avx = (lo & 0x6) == 0x6;
            f->os_avx512 = (lo & 0xe6) == 0xe6;
            f->os_amx = (lo & 0x60000) == 0x60000;
        }
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = (b >> 5) & 1;
        f->avx512f = (b >> 16) & 1;
        f->amx_bf16 = (d >> 22) & 1;
        f->amx_tile = (d >> 24) & 1;
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512_bf16 = (a >> 5) & 1;
    }
#endif
}

static const char *yes_no(int have, int os) { return !have ? "no" : os ? "yes" : "in the CPU, off in the OS"; }

const struct tr_openmp_wait tr_openmp_waits[TR_OPENMP_WAITS] = {
    {"OMP_WAIT_POLICY", NULL},
    {"GOMP_SPINCOUNT", "10000"}, /* libgomp: iterations, about 0.2-0.5 ms */
    {"KMP_BLOCKTIME", "1"},      /* LLVM's libomp: ms */
};

static void print_cpu(FILE *out)
{
    struct cpu_features f;
    cpu_probe(&f);
    const char *model = f.model;
    while (*model == ' ')
        model++;
    fprintf(out, "CPU\n  model            %s\n", *model ? model : "(unknown)");
    if (!f.x86) {
        fprintf(out, "  features         not an x86 CPU: the portable kernels run\n");
    } else {
        fprintf(out, "  avx2 / fma / f16c  %s / %s / %s\n", yes_no(f.avx2, f.os_avx),
                yes_no(f.fma, f.os_avx), yes_no(f.f16c, f.os_avx));
        fprintf(out, "  avx512f          %s\n", yes_no(f.avx512f, f.os_avx512));
        fprintf(out, "  avx512_bf16      %s\n", yes_no(f.avx512_bf16, f.os_avx512));
        fprintf(out, "  amx (tile, bf16) %s, %s\n", yes_no(f.amx_tile, f.os_amx),
                yes_no(f.amx_bf16, f.os_amx));
    }
    tr_err err = {{0}};
    struct tr_topo *t = tr_topo_open(NULL, &err);
    if (t) {
        fprintf(out, "  cores / threads  %d / %d (hwloc)\n", tr_topo_cores(t), tr_topo_pus(t));
        tr_topo_close(t);
    } else {
        fprintf(out, "  cores / threads  unknown (%s); %ld online\n", err.msg,
                sysconf(_SC_NPROCESSORS_ONLN));
    }
    /* main.c (prefer_short_spin_openmp) sets the spin unless the user did */
    fprintf(out, "  OpenMP waiting  ");
    int any = 0;
    for (int i = 0; i < TR_OPENMP_WAITS; i++) {
        const char *v = getenv(tr_openmp_waits[i].name);
        if (v != NULL)
            fprintf(out, " %s=%s", tr_openmp_waits[i].name, v), any = 1;
    }
    fprintf(out, "%s (trainrun's default: a short spin,", any ? "" : " the OpenMP runtime's default");
    for (int i = 0; i < TR_OPENMP_WAITS; i++)
        if (tr_openmp_waits[i].short_spin != NULL)
            fprintf(out, " %s=%s", tr_openmp_waits[i].name, tr_openmp_waits[i].short_spin);
    fprintf(out, ", unless one of the three is set)\n");
}

/* ---- device backends ------------------------------------------------------ */

/* Prints every line of text indented. */
static void print_indented(FILE *out, const char *text)
{
    while (*text) {
        const char *nl = strchr(text, '\n');
        size_t len = nl ? (size_t)(nl - text) : strlen(text);
        fprintf(out, "    %.*s\n", (int)len, text);
        text += len + (nl ? 1 : 0);
    }
}

/* One backend_<name>.so: loads? describe, then open and close. */
static int probe_backend(FILE *out, const char *path, const char *name)
{
    fprintf(out, "  %s (%s)\n", name, path);
    void *h;
    char why[512] = "";
    const struct tr_backend_module *m = tr_backend_module_load(path, &h, why, sizeof why);
    if (!m) {
        fprintf(out, "    %s\n", why);
        return 1;
    }
    if (TR_HAS_SLOT(m, struct tr_backend_module, describe)) {
        char text[4096] = "";
        if (m->describe(text, sizeof text) == 0)
            print_indented(out, text);
    }
    struct tr_backend be;
    memset(&be, 0, sizeof be);
    int problems = 0;
    if (m->open(&be, 0, why, sizeof why) == 0) {
        be.module = m;
        fprintf(out, "    device=%s: available\n", name);
        m->close(&be);
    } else {
        fprintf(out, "    device=%s: unavailable: %s\n", name, why[0] ? why : "the backend did not start");
        /* a missing device is this machine's fact, not a broken install */
    }
    /* the module stays mapped: a device runtime may keep threads in it */
    return problems;
}

static int print_backends(FILE *out, const struct tr_plugin_path *search)
{
    /* which GEMMs precision bf16 and fp16 run here (ONEDNN_MAX_CPU_ISA can
     * force the emulation on a CPU that has the instructions) */
    fprintf(out, "Backends\n  cpu (built in)\n    %s\n    %s\n    device=cpu: available\n",
            tr_cpu_gemm_path(TR_BF16), tr_cpu_gemm_path(TR_F16));
    int problems = 0;
    char **seen = NULL;
    int n_seen = 0;
    for (int i = 0; i < search->n; i++) {
        DIR *d = opendir(search->dirs[i]);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t len = strlen(e->d_name);
            if (strncmp(e->d_name, "backend_", 8) != 0 || len <= 11 ||
                strcmp(e->d_name + len - 3, ".so") != 0)
                continue;
            char *name = tr_xasprintf("%.*s", (int)(len - 11), e->d_name + 8);
            int dup = 0;
            for (int k = 0; k < n_seen && !dup; k++)
                dup = strcmp(seen[k], name) == 0;
            if (dup) { /* the first on the path is the one device=<name> opens */
                free(name);
                continue;
            }
            seen = tr_xrealloc(seen, (size_t)(n_seen + 1) * sizeof *seen);
            seen[n_seen++] = name;
            char *path = tr_xasprintf("%s/%s", search->dirs[i], e->d_name);
            problems += probe_backend(out, path, name);
            free(path);
        }
        closedir(d);
    }
    if (n_seen == 0)
        fprintf(out, "  no other backend on the plugin path (this trainrun was built without "
                "CUDA, or its plugins are elsewhere)\n");
    for (int k = 0; k < n_seen; k++)
        free(seen[k]);
    free(seen);
    return problems;
}

/* ---- plugins ---------------------------------------------------------------- */

static FILE *broken_out;
static int broken_count;

static void report_broken(const char *file, const char *why)
{
    fprintf(broken_out, "  %s does not load: %s\n", file, why);
    broken_count++;
}

static int print_plugins(FILE *out, const struct tr_plugin_path *search)
{
    fprintf(out, "Plugins (searched");
    for (int i = 0; i < search->n; i++)
        fprintf(out, "%s%s", i ? ":" : " ", search->dirs[i]);
    fprintf(out, ")\n");
    broken_out = out;
    broken_count = 0;
    struct tr_plugin **all = NULL;
    int n = tr_plugin_list(search, &all, report_broken);
    for (int i = 0; i < n; i++) {
        fprintf(out, "  %-10s %-12s %s\n", tr_kind_name(all[i]->info->kind), all[i]->info->name,
                all[i]->info->version ? all[i]->info->version : "");
        tr_plugin_close(all[i]);
    }
    free(all);
    if (n == 0)
        fprintf(out, "  none found\n");
    return broken_count;
}

int tr_doctor(FILE *out, const struct tr_plugin_path *search)
{
    print_cpu(out);
    int problems = print_backends(out, search);
    problems += print_plugins(out, search);
    fprintf(out, "%s\n", problems ? "Some files above do not load: see why on their lines."
                                  : "Everything installed loads.");
    return problems;
}
