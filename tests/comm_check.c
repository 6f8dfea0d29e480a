/*
 * comm_check: exercises a comm plugin through the plugin ABI alone, the way
 * the core uses it (dlopen, option table, create on the main thread,
 * collectives from a second thread), on however many ranks the launcher
 * starts.
 *
 *   mpirun -np 2 tests/comm_check plugins/.libs/comm_mpi.so
 *   TRAINRUN_RANK=0 TRAINRUN_WORLD_SIZE=2 TRAINRUN_MASTER=127.0.0.1:29500 \
 *       tests/comm_check plugins/.libs/comm_tcp.so timeout=30 &  (and rank 1)
 *
 * Rank and world come from TRAINRUN_RANK/TRAINRUN_WORLD_SIZE, else
 * SLURM_PROCID/SLURM_NTASKS, else OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE
 * (the core's order).  Arguments after the plugin are the plugin's options
 * as key=value, or:
 *   --device=cuda   buffers in GPU memory (libcudart is loaded at run time)
 *   --die=R         rank R kills itself (SIGKILL) after the first checks,
 *                   while the others keep calling collectives (an allreduce)
 *   --stall=R       rank R stops calling collectives and sleeps
 *   --die=R:COLL    rank R is killed inside collective COLL (allreduce,
 *   --stall=R:COLL  reduce_scatter, allgather, broadcast, sendrecv: every
 *                   rank sends 16 MiB to the next one, sendfar: to the
 *                   rank two ahead (4 ranks and more), or group: R and
 *                   a rank half the world away sum 16 MiB with
 *                   allreduce_group while the rest wait in an allreduce
 *                   of the world), or stopped
 *                   there (SIGSTOP, as a debugger or a hung driver would),
 *                   0.3 s after entering it; rank R+1 (sendfar: R+2;
 *                   group: R's partner) enters 1 s late, so
 *                   the call cannot have finished, and the others are
 *                   inside it too.  They go on calling COLL (a collective
 *                   may still complete when R's part had already gone
 *                   out) until it fails, as it must.
 *   --iterations=N  rounds of allreduce and reduce_scatter of varying size
 *                   (default 20)
 *   --rs-tolerance=T  reduce_scatter on inexact data may differ from
 *                   allreduce_sum by T times the sum of the magnitudes
 *                   added (default 0: bit for bit)
 *   --only-sendrecv after the first few collectives, check sendrecv alone
 *                   (skipped otherwise where the plugin has none)
 *   --only-groups   after the first few collectives, check allreduce_group
 *                   alone (skipped otherwise where the plugin has none)
 * Each rank prints "comm_check rank R/W: PASS" and exits 0, or "FAIL: ..."
 * and exits 1.  A failed collective says how long it took: "allreduce_sum
 * of N floats (failed after 2.0 s): <the plugin's message>", or with a
 * fault, how long after it: "(failed 2.1 s after the fault)".
 *
 * Data are integers times 1/8, so every sum is exact in float whatever the
 * order of additions, and each rank computes the expected result itself
 * because every rank's data follow from its rank number.  One check uses
 * inexact data instead (sums that round): reduce_scatter against
 * allreduce_sum of the same floats, and allreduce_sum's bits on every rank.
 *
 * sendrecv (point to point) moves messages between ring neighbours larger
 * than any socket buffer, every rank at once (each to the next, or to the
 * previous), pairs exchanging both ways in one call, send-only and
 * receive-only calls along a chain, small messages queued and received in
 * order, peers two ranks away (from 4 ranks on: taken, 12 MiB each way,
 * or refused with a message), and peers that do not exist refused; contents are bytes every
 * rank computes from the sender, the receiver and the message's number.
 *
 * allreduce_group sums among every pair of ranks (neighbours on the ring
 * or not), then among groups that share ranks called one after another
 * (evens, odds, all but the last, all but the first, one rank alone, the
 * world), a few times over with other sizes, one of them larger than the
 * tcp ring's scratch; only the members call.  Inexact data check that
 * every member ends with the same bits (an allgather of each member's
 * hash of them).
 */
#include <trainrun/plugin.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank = 0, world = 1;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "comm_check rank %d/%d: FAIL: ", rank, world);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
    exit(1);
}

/* The first of the variables that is set, as an int; -1 if none is. */
static int env_int(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && v[0])
            return atoi(v);
    }
    return -1;
}

/* A value every rank can compute: (hash % 2001 - 1000) / 8, exact in float. */
static float value_of(uint64_t seed, uint64_t rank_, uint64_t i)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (rank_ + 1) * 0xC2B2AE3D27D4EB4Full ^ i;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return (float)((int)(x % 2001) - 1000) * 0.125f;
}

/* Inexact data: a 24-bit mantissa over exponents 2^-8 .. 2^7, either sign,
 * so that sums round and their order of additions shows in the last bits. */
static float inexact_of(uint64_t seed, uint64_t rank_, uint64_t i)
{
    uint64_t x = seed * 0xD6E8FEB86659FD93ull ^ (rank_ + 1) * 0x9E3779B97F4A7C15ull ^
                 i * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    float m = (float)(x & 0xFFFFFF) / (float)(1 << 24) + 0.5f;
    return ldexpf((x >> 24) & 1 ? -m : m, (int)((x >> 25) % 16) - 8);
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the host side of the ABI ------------------------------------------- */

static void host_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[rank %d] %s %s: ", rank, names[level & 3], who);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void *host_alloc(size_t size)
{
    return aligned_alloc(64, (size + 63) / 64 * 64);
}

static const struct tr_host host = {
    .struct_size = sizeof(struct tr_host),
    .log = host_log,
    .alloc = host_alloc,
    .free = free,
};

/* Fills the plugin's config struct from its option table: defaults, then
 * key=value arguments (what the core does from a recipe). */
static void *parse_options(const struct tr_plugin_info *info, char **kv, int n)
{
    void *config = calloc(1, info->config_size ? info->config_size : 1);
    if (!config)
        die("out of memory");
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(kv[i], '=');
        int known = 0;
        for (const struct tr_option *o = info->options; o && o->type != TR_OPT_END; o++)
            known |= eq && strlen(o->name) == (size_t)(eq - kv[i]) &&
                     strncmp(o->name, kv[i], (size_t)(eq - kv[i])) == 0;
        if (!known)
            die("'%s' is not an option of comm plugin %s", kv[i], info->name);
    }
    for (const struct tr_option *o = info->options; o && o->type != TR_OPT_END; o++) {
        const char *text = o->default_value;
        for (int i = 0; i < n; i++)
            if (strncmp(kv[i], o->name, strlen(o->name)) == 0 && kv[i][strlen(o->name)] == '=')
                text = kv[i] + strlen(o->name) + 1;
        if (!text)
            die("option %s of comm plugin %s is required", o->name, info->name);
        char *slot = (char *)config + o->offset;
        switch (o->type) {
        case TR_OPT_INT: {
            int64_t v = strtoll(text, NULL, 10);
            memcpy(slot, &v, sizeof v);
            break;
        }
        case TR_OPT_FLOAT: {
            double v = strtod(text, NULL);
            memcpy(slot, &v, sizeof v);
            break;
        }
        case TR_OPT_BOOL: {
            int v = strcmp(text, "true") == 0 || strcmp(text, "1") == 0;
            memcpy(slot, &v, sizeof v);
            break;
        }
        case TR_OPT_STRING:
        case TR_OPT_ENUM:
            memcpy(slot, &text, sizeof text);
            break;
        default:
            die("option %s has unknown type %d", o->name, (int)o->type);
        }
    }
    return config;
}

/* ---- buffers: host memory, or GPU memory through a dlopen'ed libcudart --- */

static struct {
    int on_gpu, device;
    int (*set_device)(int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int); /* kind 1: to device, 2: to host */
    int (*synchronize)(void);
} mem;

static void use_gpu(int local_rank)
{
    void *lib = dlopen("libcudart.so", RTLD_NOW);
    if (!lib)
        lib = dlopen("libcudart.so.13", RTLD_NOW);
    if (!lib)
        lib = dlopen("libcudart.so.12", RTLD_NOW);
    if (!lib)
        die("--device=cuda: cannot load libcudart: %s", dlerror());
    *(void **)&mem.set_device = dlsym(lib, "cudaSetDevice");
    *(void **)&mem.malloc_ = dlsym(lib, "cudaMalloc");
    *(void **)&mem.free_ = dlsym(lib, "cudaFree");
    *(void **)&mem.memcpy_ = dlsym(lib, "cudaMemcpy");
    *(void **)&mem.synchronize = dlsym(lib, "cudaDeviceSynchronize");
    if (!mem.set_device || !mem.malloc_ || !mem.free_ || !mem.memcpy_ || !mem.synchronize)
        die("--device=cuda: libcudart lacks cudaMalloc/cudaMemcpy/cudaDeviceSynchronize");
    mem.on_gpu = 1;
    int (*count)(int *) = NULL;
    *(void **)&count = dlsym(lib, "cudaGetDeviceCount");
    int gpus = 0;
    if (!count || count(&gpus) != 0 || gpus == 0)
        die("--device=cuda: no GPU visible");
    mem.device = gpus == 1 ? 0 : local_rank;
    if (mem.set_device(mem.device) != 0)
        die("--device=cuda: cudaSetDevice(%d) failed", mem.device);
}

/* Buffer the plugin sees (device or host), and its host mirror. */
struct buffer {
    void *dev;
    void *host;
    size_t bytes;
};

static struct buffer buffer_new(size_t bytes)
{
    struct buffer b = {NULL, malloc(bytes ? bytes : 1), bytes};
    if (!b.host)
        die("out of memory for %zu bytes", bytes);
    if (mem.on_gpu) {
        if (mem.malloc_(&b.dev, bytes ? bytes : 1) != 0)
            die("cudaMalloc of %zu bytes failed", bytes);
    } else {
        b.dev = b.host;
    }
    return b;
}

static void to_plugin(struct buffer *b)
{
    if (mem.on_gpu && mem.memcpy_(b->dev, b->host, b->bytes, 1) != 0)
        die("cudaMemcpy to the device failed");
    /* from pageable memory cudaMemcpy may return before the DMA has
     * written the device; the plugin's collective runs on a non-blocking
     * stream that nothing orders after it */
    if (mem.on_gpu && mem.synchronize() != 0)
        die("cudaDeviceSynchronize after the copy to the device failed");
}

static void from_plugin(struct buffer *b)
{
    if (mem.on_gpu && mem.memcpy_(b->host, b->dev, b->bytes, 2) != 0)
        die("cudaMemcpy to the host failed");
}

static void buffer_free(struct buffer *b)
{
    if (mem.on_gpu)
        mem.free_(b->dev);
    free(b->host);
}

/* ---- the checks ----------------------------------------------------------- */

static const struct tr_comm_vtable *vt;
static void *self;

#define HAS(slot) TR_HAS_SLOT(vt, struct tr_comm_vtable, slot)

/* When a --die/--stall fault began (about: the others cannot see it), or 0. */
static double fault_began;
static int fault_rank = -1; /* --die/--stall=R:COLL's R */

/* A collective that failed: its message, and how long it took (since the
 * fault, when one was made). */
static void failed(double since, const tr_err *err, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (fault_began > 0)
        die("%s (failed %.1f s after the fault): %s", what, seconds() - fault_began, err->msg);
    die("%s (failed after %.1f s): %s", what, seconds() - since, err->msg);
}

static void check_allreduce(size_t count, uint64_t seed)
{
    struct buffer b = buffer_new(count * sizeof(float));
    float *x = b.host;
    for (size_t i = 0; i < count; i++)
        x[i] = value_of(seed, (uint64_t)rank, i);
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->allreduce_sum(self, b.dev, count, &err) != TR_OK)
        failed(t0, &err, "allreduce_sum of %zu floats", count);
    from_plugin(&b);
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < world; r++)
            want += value_of(seed, (uint64_t)r, i);
        if (x[i] != want)
            die("allreduce_sum of %zu floats: element %zu is %g, want %g", count, i, (double)x[i],
                (double)want);
    }
    buffer_free(&b);
}

static void check_broadcast(size_t bytes, int root, uint64_t seed)
{
    struct buffer b = buffer_new(bytes);
    unsigned char *p = b.host;
    for (size_t i = 0; i < bytes; i++)
        p[i] = rank == root ? (unsigned char)(value_of(seed, (uint64_t)root, i) * 8)
                            : (unsigned char)(0xA5 ^ rank);
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->broadcast(self, b.dev, bytes, root, &err) != TR_OK)
        failed(t0, &err, "broadcast of %zu bytes from rank %d", bytes, root);
    from_plugin(&b);
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != (unsigned char)(value_of(seed, (uint64_t)root, i) * 8))
            die("broadcast of %zu bytes from rank %d: byte %zu differs", bytes, root, i);
    buffer_free(&b);
}

static void check_allgather(size_t count, uint64_t seed)
{
    struct buffer b = buffer_new((size_t)world * count * sizeof(float));
    float *x = b.host;
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < count; i++)
            x[(size_t)r * count + i] = r == rank ? value_of(seed, (uint64_t)r, i) : -12345.0f;
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->allgather(self, b.dev, count, &err) != TR_OK)
        failed(t0, &err, "allgather of %zu floats per rank", count);
    from_plugin(&b);
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < count; i++)
            if (x[(size_t)r * count + i] != value_of(seed, (uint64_t)r, i))
                die("allgather of %zu floats per rank: element %zu of rank %d's part is %g, "
                    "want %g",
                    count, i, r, (double)x[(size_t)r * count + i],
                    (double)value_of(seed, (uint64_t)r, i));
    buffer_free(&b);
}

/* Rank r's part of the sums, buf + r*count, after a reduce_scatter of
 * world*count exact floats; the rest of buf may be anything. */
static void check_reduce_scatter(size_t count, uint64_t seed)
{
    size_t n = (size_t)world * count;
    struct buffer b = buffer_new(n * sizeof(float));
    float *x = b.host;
    for (size_t i = 0; i < n; i++)
        x[i] = value_of(seed, (uint64_t)rank, i);
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->reduce_scatter(self, b.dev, count, &err) != TR_OK)
        failed(t0, &err, "reduce_scatter of %zu floats per rank", count);
    from_plugin(&b);
    const float *mine = x + (size_t)rank * count;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < world; r++)
            want += value_of(seed, (uint64_t)r, (size_t)rank * count + i);
        if (mine[i] != want)
            die("reduce_scatter of %zu floats per rank: element %zu of rank %d's part is %g, "
                "want %g",
                count, i, rank, (double)mine[i], (double)want);
    }
    buffer_free(&b);
}

/* Inexact data, whose sums round: allreduce_sum leaves the same bits on
 * every rank (rank 0's broadcast to compare), and reduce_scatter of the
 * same world*count floats leaves in rank r's part what allreduce_sum left
 * there, bit for bit, or within `tolerance` times the sum of magnitudes. */
static void check_reduce_scatter_inexact(size_t count, uint64_t seed, double tolerance)
{
    size_t n = (size_t)world * count;
    struct buffer a = buffer_new(n * sizeof(float)), b = buffer_new(n * sizeof(float));
    struct buffer z = buffer_new(n * sizeof(float));
    float *xa = a.host, *xb = b.host, *xz = z.host;
    for (size_t i = 0; i < n; i++)
        xa[i] = xb[i] = inexact_of(seed, (uint64_t)rank, i);
    to_plugin(&a);
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->allreduce_sum(self, a.dev, n, &err) != TR_OK)
        failed(t0, &err, "allreduce_sum of %zu inexact floats", n);
    t0 = seconds();
    if (vt->reduce_scatter(self, b.dev, count, &err) != TR_OK)
        failed(t0, &err, "reduce_scatter of %zu inexact floats per rank", count);
    from_plugin(&a);
    from_plugin(&b);
    memcpy(xz, xa, n * sizeof(float));
    to_plugin(&z);
    t0 = seconds();
    if (vt->broadcast(self, z.dev, n * sizeof(float), 0, &err) != TR_OK)
        failed(t0, &err, "broadcast of %zu bytes from rank 0", n * sizeof(float));
    from_plugin(&z);
    if (memcmp(xz, xa, n * sizeof(float)) != 0)
        die("allreduce_sum of %zu inexact floats left other bits on this rank than on rank 0", n);

    size_t differ = 0, first = 0;
    double worst = 0; /* the largest difference, in units of the sum of magnitudes */
    for (size_t i = 0; i < count; i++) {
        size_t at = (size_t)rank * count + i;
        double exact = 0, magnitude = 0;
        for (int r = 0; r < world; r++) {
            exact += inexact_of(seed, (uint64_t)r, at);
            magnitude += fabs((double)inexact_of(seed, (uint64_t)r, at));
        }
        /* a sum at all: (world-1) roundings of at most half an ulp each */
        if (fabs((double)xb[at] - exact) > (double)world * 0x1p-24 * magnitude)
            die("reduce_scatter of %zu inexact floats per rank: element %zu of rank %d's part "
                "is %.9g, the sum is %.9g",
                count, i, rank, (double)xb[at], exact);
        if (memcmp(&xb[at], &xa[at], sizeof(float)) != 0) {
            double d = fabs((double)xb[at] - (double)xa[at]) / magnitude;
            if (!differ++)
                first = i;
            worst = d > worst ? d : worst;
        }
    }
    printf("comm_check rank %d/%d: reduce_scatter of %zu inexact floats per rank: %s", rank, world,
           count, differ ? "" : "bit-identical to allreduce_sum\n");
    if (differ)
        printf("%zu of %zu differ from allreduce_sum (first: element %zu; largest difference "
               "%.2g of the sum of magnitudes)\n",
               differ, count, first, worst);
    if (differ && worst > tolerance)
        die("reduce_scatter of %zu inexact floats per rank differs from allreduce_sum by %.2g of "
            "the sum of magnitudes, more than --rs-tolerance=%g",
            count, worst, tolerance);
    buffer_free(&a);
    buffer_free(&b);
    buffer_free(&z);
}

/* ---- point to point -------------------------------------------------------- */

/* Byte i of message `seq` from rank `from` to rank `to`. */
static unsigned char byte_of(uint64_t seq, int from, int to, size_t i)
{
    uint64_t x = (seq + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(from + 1) * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)(to + 1) * 0xD6E8FEB86659FD93ull ^ (i >> 3);
    x ^= x >> 31;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 29;
    return (unsigned char)(x >> ((i & 7) * 8));
}

static int next_of(int r) { return (r + 1) % world; }
static int prev_of(int r) { return (r + world - 1) % world; }

/* One sendrecv: message `seq` of send_bytes to `to` (-1: none) and one of
 * recv_bytes from `from` (-1: none), whose contents are checked. */
static void p2p(uint64_t seq, size_t send_bytes, int to, size_t recv_bytes, int from,
                const char *what)
{
    struct buffer s = buffer_new(send_bytes), r = buffer_new(recv_bytes);
    unsigned char *out = s.host, *in = r.host;
    for (size_t i = 0; i < send_bytes; i++)
        out[i] = byte_of(seq, rank, to, i);
    memset(in, 0xA5, recv_bytes);
    to_plugin(&s);
    to_plugin(&r);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->sendrecv(self, s.dev, send_bytes, to, r.dev, recv_bytes, from, &err) != TR_OK)
        failed(t0, &err, "sendrecv (%s: %zu bytes to rank %d, %zu from rank %d)", what, send_bytes,
               to, recv_bytes, from);
    from_plugin(&r);
    for (size_t i = 0; i < recv_bytes; i++)
        if (in[i] != byte_of(seq, from, rank, i))
            die("sendrecv (%s): byte %zu of %zu from rank %d is %u, want %u", what, i, recv_bytes,
                from, in[i], byte_of(seq, from, rank, i));
    buffer_free(&s);
    buffer_free(&r);
}

/* Rank r's size of a message it sends in check `seq`: big, give or take. */
static size_t size_from(int r, size_t big, uint64_t seq)
{
    return big + (size_t)r * 4099 + (size_t)(seq % 7) * 13;
}

/* A peer that does not exist, or one that is no ring neighbour (where a
 * plugin takes ring neighbours only): refused, and the next call works.
 * Returns 1 when a far peer was taken. */
static int check_sendrecv_refusals(void)
{
    unsigned char b[4] = {0};
    tr_err err = {{0}};
    if (vt->sendrecv(self, b, sizeof b, world, b, sizeof b, -1, &err) == TR_OK)
        die("sendrecv to rank %d of %d ranks was taken", world, world);
    if (!strstr(err.msg, "rank"))
        die("sendrecv to rank %d of %d ranks: the message does not say which rank: %s", world,
            world, err.msg);
    if (vt->sendrecv(self, b, sizeof b, -1, b, sizeof b, -2, &err) == TR_OK)
        die("sendrecv from rank -2 was taken");
    if (world < 4)
        return 0;
    /* every rank at once: to r+2, from r-2 */
    int to = (rank + 2) % world, from = (rank + world - 2) % world;
    struct buffer s = buffer_new(1000), r = buffer_new(1000);
    unsigned char *out = s.host, *in = r.host;
    for (size_t i = 0; i < 1000; i++)
        out[i] = byte_of(90, rank, to, i);
    to_plugin(&s);
    int rc = vt->sendrecv(self, s.dev, 1000, to, r.dev, 1000, from, &err);
    from_plugin(&r);
    if (rc != TR_OK && !strstr(err.msg, "neighbour"))
        die("sendrecv to rank %d (not a ring neighbour) failed without saying why: %s", to,
            err.msg);
    for (size_t i = 0; rc == TR_OK && i < 1000; i++)
        if (in[i] != byte_of(90, from, rank, i))
            die("sendrecv from rank %d (not a ring neighbour): byte %zu differs", from, i);
    if (rc != TR_OK && rank == 0)
        printf("comm_check: sendrecv beyond the ring neighbours refused: %s\n", err.msg);
    buffer_free(&s);
    buffer_free(&r);
    /* taken: more than the sockets hold, both ways at once */
    if (rc == TR_OK)
        p2p(91, (size_t)12 << 20, to, (size_t)12 << 20, from, "12 MiB beyond the neighbours");
    return rc == TR_OK;
}

/* ---- groups ------------------------------------------------------------- */

/* allreduce_group among the n ranks `ranks` (ascending) of count floats;
 * non-members return at once.  Exact data: the sum checked element by
 * element.  Returns a hash of the result's bits (0 for non-members). */
static uint32_t group_sum(const int *ranks, int n, size_t count, uint64_t seed, int inexact)
{
    int member = 0;
    for (int i = 0; i < n; i++)
        member |= ranks[i] == rank;
    if (!member)
        return 0;
    struct buffer b = buffer_new(count * sizeof(float));
    float *x = b.host;
    for (size_t i = 0; i < count; i++)
        x[i] = inexact ? inexact_of(seed, (uint64_t)rank, i) : value_of(seed, (uint64_t)rank, i);
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    char who[96];
    size_t used = (size_t)snprintf(who, sizeof who, "ranks");
    for (int i = 0; i < n && used < sizeof who; i++)
        used += (size_t)snprintf(who + used, sizeof who - used, " %d", ranks[i]);
    if (vt->allreduce_group(self, b.dev, count, ranks, n, &err) != TR_OK)
        failed(t0, &err, "allreduce_group of %zu floats among %s", count, who);
    from_plugin(&b);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < count; i++) {
        if (!inexact) {
            float want = 0;
            for (int k = 0; k < n; k++)
                want += value_of(seed, (uint64_t)ranks[k], i);
            if (x[i] != want)
                die("allreduce_group of %zu floats among %s: element %zu is %g, want %g", count,
                    who, i, (double)x[i], (double)want);
        }
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        h = (h ^ bits) * 16777619u;
    }
    buffer_free(&b);
    return h | 1; /* never 0: members and non-members tell apart */
}

/* Every member's hash of an inexact group sum, compared through an
 * allgather of the world: the members must agree bit for bit. */
static void same_bits_among(const int *ranks, int n, uint32_t mine)
{
    if (!HAS(allgather))
        return;
    struct buffer b = buffer_new((size_t)world * sizeof(float));
    memcpy((char *)b.host + (size_t)rank * sizeof(float), &mine, sizeof mine);
    to_plugin(&b);
    tr_err err = {{0}};
    double t0 = seconds();
    if (vt->allgather(self, b.dev, 1, &err) != TR_OK)
        failed(t0, &err, "allgather of the group sums' hashes");
    from_plugin(&b);
    uint32_t first = 0;
    for (int k = 0; k < n; k++) {
        uint32_t h;
        memcpy(&h, (char *)b.host + (size_t)ranks[k] * sizeof(float), sizeof h);
        if (k == 0)
            first = h;
        else if (h != first)
            die("allreduce_group of inexact floats left rank %d other bits than rank %d",
                ranks[k], ranks[0]);
    }
    buffer_free(&b);
}

/* reduce_scatter_group and allgather_group among the n ranks `ranks` of
 * n*count floats (non-members return at once): the reduce-scatter's part
 * of each member checked element by element against the sums and, on
 * inexact data, against allreduce_group's bits (as the world's
 * reduce_scatter: within `tolerance` of the sum of magnitudes, 0: bit for
 * bit); the all-gather's parts against each member's values (the rest of
 * buf poisoned first). */
static void group_parts(const int *ranks, int n, size_t count, uint64_t seed, double tolerance)
{
    int me = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == rank)
            me = i;
    if (me < 0)
        return;
    size_t total = (size_t)n * count;
    struct buffer b = buffer_new(total * sizeof(float)), a = buffer_new(total * sizeof(float));
    float *x = b.host, *y = a.host;
    char who[96];
    size_t used = (size_t)snprintf(who, sizeof who, "ranks");
    for (int i = 0; i < n && used < sizeof who; i++)
        used += (size_t)snprintf(who + used, sizeof who - used, " %d", ranks[i]);
    tr_err err = {{0}};
    double t0 = seconds();
    for (int inexact = 0; inexact < 2; inexact++) {
        for (size_t i = 0; i < total; i++)
            x[i] = y[i] = inexact ? inexact_of(seed, (uint64_t)rank, i)
                                  : value_of(seed, (uint64_t)rank, i);
        to_plugin(&b);
        to_plugin(&a);
        if (vt->reduce_scatter_group(self, b.dev, count, ranks, n, &err) != TR_OK)
            failed(t0, &err, "reduce_scatter_group of %zu floats a member among %s", count, who);
        if (inexact && vt->allreduce_group(self, a.dev, total, ranks, n, &err) != TR_OK)
            failed(t0, &err, "allreduce_group of %zu floats among %s", total, who);
        from_plugin(&b);
        from_plugin(&a);
        for (size_t j = 0; j < count; j++) {
            size_t i = (size_t)me * count + j;
            float want = 0;
            for (int k = 0; !inexact && k < n; k++)
                want += value_of(seed, (uint64_t)ranks[k], i);
            double magnitude = 0;
            for (int k = 0; inexact && k < n; k++)
                magnitude += fabs((double)inexact_of(seed, (uint64_t)ranks[k], i));
            int off = inexact ? memcmp(&x[i], &y[i], sizeof x[i]) != 0 &&
                                    fabs((double)x[i] - (double)y[i]) > tolerance * magnitude
                              : x[i] != want;
            if (off)
                die("reduce_scatter_group of %zu floats a member among %s: element %zu of member "
                    "%d is %.9g, want %.9g%s", count, who, j, me, (double)x[i],
                    (double)(inexact ? y[i] : want),
                    inexact ? " (allreduce_group's, within --rs-tolerance)" : "");
        }
    }
    for (size_t i = 0; i < total; i++)
        x[i] = i / count == (size_t)me ? value_of(seed + 1, (uint64_t)rank, i) : -12345.0f;
    to_plugin(&b);
    if (vt->allgather_group(self, b.dev, count, ranks, n, &err) != TR_OK)
        failed(t0, &err, "allgather_group of %zu floats a member among %s", count, who);
    from_plugin(&b);
    for (size_t i = 0; i < total; i++) {
        int k = (int)(i / count);
        if (x[i] != value_of(seed + 1, (uint64_t)ranks[k], i))
            die("allgather_group of %zu floats a member among %s: element %zu (member %d's) is "
                "%g, want %g", count, who, i, k, (double)x[i],
                (double)value_of(seed + 1, (uint64_t)ranks[k], i));
    }
    buffer_free(&b);
    buffer_free(&a);
}

static void check_groups(double tolerance)
{
    int *g = calloc((size_t)world, sizeof *g);
    if (!g)
        die("out of memory");
    /* every pair, ring neighbours or not */
    uint64_t seed = 400;
    for (int a = 0; a < world; a++)
        for (int b = a + 1; b < world; b++) {
            g[0] = a, g[1] = b;
            group_sum(g, 2, 1, seed++, 0);
            group_sum(g, 2, 1000 + (size_t)a * 7 + (size_t)b, seed++, 0);
        }
    /* groups sharing ranks, called in one order by all, with other sizes */
    for (int round = 0; round < 3; round++) {
        size_t count = round == 1 ? (3u << 18) + 5 : 997 + (size_t)round * 4099;
        int n = 0;
        for (int r = 0; r < world; r += 2)
            g[n++] = r;
        group_sum(g, n, count, seed++, 0);
        n = 0;
        for (int r = 1; r < world; r += 2)
            g[n++] = r;
        group_sum(g, n, count, seed++, 0);
        for (n = 0; n < world - 1; n++)
            g[n] = n;
        group_sum(g, n, count, seed++, 0);
        for (n = 0; n < world - 1; n++)
            g[n] = n + 1;
        group_sum(g, n, count, seed++, 0);
        g[0] = round % world;
        group_sum(g, 1, count, seed++, 0);
        for (n = 0; n < world; n++)
            g[n] = n;
        group_sum(g, n, count, seed++, 0);
    }
    /* the same bits on every member */
    for (int n = 2; n <= world; n++) {
        for (int k = 0; k < n; k++)
            g[k] = world - n + k; /* the last n ranks */
        uint32_t h = group_sum(g, n, (1u << 16) + 3, seed++, 1);
        same_bits_among(g, n, h);
    }
    /* a rank outside the list is refused, naming itself */
    if (world >= 3) {
        int out[2] = {(rank + 1) % world, (rank + 2) % world};
        if (out[0] > out[1])
            out[0] ^= out[1], out[1] ^= out[0], out[0] ^= out[1];
        tr_err err = {{0}};
        float x = 1;
        if (vt->allreduce_group(self, &x, 1, out, 2, &err) == TR_OK)
            die("allreduce_group on a rank not among its ranks was taken");
        if (!strstr(err.msg, "not among"))
            die("allreduce_group on a rank not among its ranks: the message does not say so: %s",
                err.msg);
    }
    /* a group's reduce-scatter and all-gather (plugin ABI 2.7): pairs,
     * overlapping groups, the world */
    if (HAS(reduce_scatter_group) && HAS(allgather_group)) {
        for (int a = 0; a < world; a++)
            for (int b = a + 1; b < world; b++) {
                g[0] = a, g[1] = b;
                group_parts(g, 2, 1, seed++, tolerance);
                group_parts(g, 2, 777 + (size_t)a * 5 + (size_t)b, seed++, tolerance);
            }
        int n = 0;
        for (int r = 0; r < world; r += 2)
            g[n++] = r;
        group_parts(g, n, (1u << 17) + 3, seed++, tolerance);
        for (n = 0; n < world - 1; n++)
            g[n] = n + 1;
        group_parts(g, n, 4099, seed++, tolerance);
        for (n = 0; n < world; n++)
            g[n] = n;
        group_parts(g, n, 4099, seed++, tolerance);
        if (rank == 0)
            printf("comm_check: reduce_scatter_group and allgather_group pass among pairs, "
                   "overlapping groups and the world\n");
    }
    free(g);
    if (rank == 0)
        printf("comm_check: allreduce_group passes among pairs (ring neighbours and not) and "
               "overlapping groups\n");
}

/* The fault's group: rank R and a rank half the world away (not its ring
 * neighbour from 4 ranks on). */
static int group_partner(int faulty)
{
    return (faulty + (world >= 4 ? world / 2 : 1)) % world;
}

static void check_sendrecv(size_t big)
{
    int next = next_of(rank), prev = prev_of(rank);
    uint64_t seq = 1000;
    /* every rank at once, each to the next (the pipeline's forward), then
     * each to the previous (its backward): no rank's send waits for its
     * receive, or the ring would deadlock on messages larger than the
     * sockets hold */
    for (int round = 0; round < 2; round++, seq++) {
        p2p(seq, size_from(rank, big, seq), next, size_from(prev, big, seq), prev, "to the next");
        seq++;
        p2p(seq, size_from(rank, big, seq), prev, size_from(next, big, seq), next,
            "to the previous");
    }
    /* pairs (a, a+1) in turn, both ways in one call, of different sizes;
     * (world-1, 0) too */
    for (int a = 0; a < world; a++, seq++) {
        int b = next_of(a);
        if (rank == a)
            p2p(seq, size_from(a, big, seq), b, size_from(b, big / 3, seq), b, "a pair, both ways");
        else if (rank == b)
            p2p(seq, size_from(b, big / 3, seq), a, size_from(a, big, seq), a, "a pair, both ways");
    }
    /* send-only and receive-only calls along a chain, forward then back */
    for (int r = 0; r + 1 < world; r++, seq++) {
        if (rank == r)
            p2p(seq, size_from(r, big, seq), r + 1, 0, -1, "send only, forward");
        else if (rank == r + 1)
            p2p(seq, 0, -1, size_from(r, big, seq), r, "receive only, forward");
    }
    for (int r = world - 1; r > 0; r--, seq++) {
        if (rank == r)
            p2p(seq, size_from(r, big, seq), r - 1, 0, -1, "send only, back");
        else if (rank == r - 1)
            p2p(seq, 0, -1, size_from(r, big, seq), r, "receive only, back");
    }
    /* small messages sent before the peer receives any: they wait, and
     * arrive in the order sent (rank 0 to 1, and 1 back to 0) */
    static const size_t small[] = {1, 100, 3000, 7};
    enum { N_SMALL = sizeof small / sizeof small[0] };
    for (int dir = 0; dir < 2; dir++) {
        int sender = dir == 0 ? 0 : 1, receiver = 1 - sender;
        for (int k = 0; k < N_SMALL; k++)
            if (rank == sender)
                p2p(seq + (uint64_t)k, small[k], receiver, 0, -1, "small, queued");
        for (int k = 0; k < N_SMALL; k++)
            if (rank == receiver)
                p2p(seq + (uint64_t)k, 0, -1, small[k], sender, "small, in order");
        seq += N_SMALL;
    }
    /* nothing at all, and zero bytes, are no messages */
    p2p(seq++, 0, next, 0, prev, "zero bytes");
    p2p(seq++, 0, -1, 0, -1, "nothing");
    /* point to point between collectives keeps both in step */
    for (int it = 0; it < 3; it++, seq++) {
        p2p(seq, size_from(rank, (size_t)it * 70001, seq), next,
            size_from(prev, (size_t)it * 70001, seq), prev, "between collectives");
        check_allreduce((size_t)it * 30011 + 5, 300 + (uint64_t)it);
    }
}

struct checks {
    int die_rank, stall_rank, iterations, only_sendrecv, only_groups;
    const char *fault_in; /* NULL: the faulty rank fails between calls */
    double rs_tolerance;
    const char *plugin;
};

/* One call of collective `coll` on `count` floats per rank (exact data,
 * unchecked: it is meant to fail). */
static void call_collective(const char *coll, size_t count)
{
    if (strcmp(coll, "allreduce") == 0)
        check_allreduce(count * (size_t)world, 11);
    else if (strcmp(coll, "reduce_scatter") == 0)
        check_reduce_scatter(count, 12);
    else if (strcmp(coll, "allgather") == 0)
        check_allgather(count, 13);
    else if (strcmp(coll, "sendrecv") == 0) /* 16 MiB: more than the sockets hold */
        p2p(15, (size_t)16 << 20, next_of(rank), (size_t)16 << 20, prev_of(rank), "to the next");
    else if (strcmp(coll, "sendfar") == 0)
        p2p(18, (size_t)16 << 20, (rank + 2) % world, (size_t)16 << 20, (rank + world - 2) % world,
            "two ranks away");
    else if (strcmp(coll, "group") == 0) { /* the faulty rank and its partner; the rest wait */
        int faulty = fault_rank, partner = group_partner(faulty);
        int g[2] = {faulty < partner ? faulty : partner, faulty < partner ? partner : faulty};
        if (rank == faulty || rank == partner)
            group_sum(g, 2, (size_t)4 << 20, 16, 0);
        else
            check_allreduce(count, 17);
    }
    else
        check_broadcast(count * sizeof(float), 0, 14);
}

static struct {
    int sig;
    double after;
} fault;

static void *raise_fault(void *arg)
{
    (void)arg;
    usleep((useconds_t)(fault.after * 1e6));
    printf("comm_check rank %d/%d: %s inside the collective on purpose\n", rank, world,
           fault.sig == SIGKILL ? "dying" : "stopping");
    raise(fault.sig);
    return NULL;
}

/* --die=R:COLL / --stall=R:COLL: rank R is killed (or stopped) 0.3 s into
 * COLL; rank R+1 joins 1 s late, so R cannot have finished it.  The others
 * call COLL again and again: one of the calls must fail. */
static void fault_inside(const struct checks *t)
{
    int faulty = t->die_rank >= 0 ? t->die_rank : t->stall_rank;
    int late = strcmp(t->fault_in, "group") == 0     ? group_partner(faulty)
               : strcmp(t->fault_in, "sendfar") == 0 ? (faulty + 2) % world
                                                     : (faulty + 1) % world;
    fault_rank = faulty;
    size_t count = 1 << 16;
    fault_began = seconds() + 0.3;
    if (rank == faulty) {
        fault.sig = t->die_rank >= 0 ? SIGKILL : SIGSTOP;
        fault.after = 0.3;
        pthread_t killer;
        if (pthread_create(&killer, NULL, raise_fault, NULL) != 0)
            die("cannot start the thread that raises the fault");
    } else if (rank == late) {
        usleep(1000 * 1000);
    }
    call_collective(t->fault_in, count);
    if (rank == faulty) /* stopped and continued */
        die("%s finished although this rank was %s inside it", t->fault_in,
            t->die_rank >= 0 ? "killed" : "stopped");
    while (seconds() - fault_began < 600)
        call_collective(t->fault_in, count);
    die("%s still completes 600 s after rank %d was %s inside it", t->fault_in, faulty,
        t->die_rank >= 0 ? "killed" : "stopped");
}

static void check_collectives(const struct checks *t)
{
    check_allreduce((1u << 20) + 3, 4);
    check_broadcast((1u << 20) + 5, world - 1, 5);
    check_broadcast(1, world / 2, 6);
    if (HAS(allgather)) {
        check_allgather(1, 7);
        check_allgather(1000, 8);
        check_allgather(65537, 9);
    } else if (rank == 0) {
        printf("comm_check: %s has no allgather (optional; parallel.zero refuses it)\n",
               t->plugin);
    }
    if (HAS(reduce_scatter)) {
        check_reduce_scatter(0, 20);
        check_reduce_scatter(1, 21);
        check_reduce_scatter(2, 22);
        check_reduce_scatter(1001, 23);
        /* far more than one piece of the tcp ring's 256 KiB scratch per segment */
        check_reduce_scatter((3u << 18) + 5, 24);
        check_reduce_scatter_inexact(1, 30, t->rs_tolerance);
        check_reduce_scatter_inexact(997, 31, t->rs_tolerance);
        check_reduce_scatter_inexact((1u << 18) + 3, 32, t->rs_tolerance);
    } else if (rank == 0) {
        printf("comm_check: %s has no reduce_scatter (optional; sharded data parallel refuses "
               "it)\n",
               t->plugin);
    }
}

static void *run_checks(void *arg)
{
    const struct checks *t = arg;
    if (mem.on_gpu && mem.set_device(mem.device) != 0) /* the current GPU is per thread */
        die("cudaSetDevice(%d) failed in the communication thread", mem.device);
    check_allreduce(1, 1);
    check_allreduce(1000, 2);
    check_broadcast(13, 0, 3);

    if (t->fault_in)
        fault_inside(t);
    fault_began = t->die_rank >= 0 || t->stall_rank >= 0 ? seconds() : 0;
    if (rank == t->die_rank) {
        printf("comm_check rank %d/%d: dying on purpose\n", rank, world);
        raise(SIGKILL);
    }
    if (rank == t->stall_rank) {
        printf("comm_check rank %d/%d: stalling on purpose\n", rank, world);
        for (int i = 0; i < 600; i++)
            sleep(1);
        die("stalled rank was not stopped within 600 s");
    }

    if (t->only_groups) {
        if (!HAS(allreduce_group))
            die("--only-groups: %s has no allreduce_group", t->plugin);
        if (world > 1)
            check_groups(t->rs_tolerance);
        return NULL;
    }
    if (!t->only_sendrecv)
        check_collectives(t);
    if (t->only_sendrecv) {
        if (!HAS(sendrecv))
            die("--only-sendrecv: %s has no sendrecv", t->plugin);
    } else if (!HAS(sendrecv) && rank == 0) {
        printf("comm_check: %s has no sendrecv (optional; pipeline stages refuse it)\n",
               t->plugin);
    }
    if (HAS(sendrecv) && world > 1) {
        int far = check_sendrecv_refusals();
        check_sendrecv(1);
        check_sendrecv(1000);
        /* several MiB: more than a socket buffer holds, so a send that
         * waited for its receive would deadlock */
        check_sendrecv((size_t)12 << 20);
        if (rank == 0)
            printf("comm_check: sendrecv passes between ring neighbours%s\n",
                   far ? " and beyond" : "");
    }
    if (t->only_sendrecv)
        return NULL;
    if (HAS(allreduce_group) && world > 1)
        check_groups(t->rs_tolerance);
    else if (!HAS(allreduce_group) && rank == 0)
        printf("comm_check: %s has no allreduce_group (optional; pipeline replicas then "
               "all-reduce over every rank)\n",
               t->plugin);

    /* Many calls of different sizes in a row: ordering and buffer reuse. */
    for (int it = 0; it < t->iterations; it++) {
        check_allreduce((size_t)(it * 7919 % 50000) + 1, 100 + (uint64_t)it);
        if (HAS(reduce_scatter))
            check_reduce_scatter((size_t)(it * 4111 % 20000), 200 + (uint64_t)it);
    }

    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const char *const rank_vars[] = {"TRAINRUN_RANK", "SLURM_PROCID",
                                            "OMPI_COMM_WORLD_RANK", NULL};
    static const char *const world_vars[] = {"TRAINRUN_WORLD_SIZE", "SLURM_NTASKS",
                                             "OMPI_COMM_WORLD_SIZE", NULL};
    static const char *const local_rank_vars[] = {"TRAINRUN_LOCAL_RANK", "SLURM_LOCALID",
                                                  "OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    static const char *const local_world_vars[] = {"TRAINRUN_LOCAL_WORLD_SIZE",
                                                   "SLURM_NTASKS_PER_NODE",
                                                   "OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
    int r = env_int(rank_vars), w = env_int(world_vars);
    if (r >= 0)
        rank = r;
    if (w >= 1)
        world = w;
    int local_rank = env_int(local_rank_vars), local_world = env_int(local_world_vars);
    if (local_rank < 0)
        local_rank = rank;
    if (local_world < 1)
        local_world = world;
    if (argc < 2 || rank >= world)
        die("usage: comm_check PLUGIN.so [--device=cuda] [--die=R[:COLL]] [--stall=R[:COLL]] "
            "[--iterations=N] [--rs-tolerance=T] [--only-sendrecv] [--only-groups] "
            "[option=value...] (rank %d "
            "of %d)",
            rank, world);

    const char *device = "cpu";
    int die_rank = -1, stall_rank = -1, iterations = 20, only_sendrecv = 0, only_groups = 0;
    const char *fault_in = NULL;
    double rs_tolerance = 0;
    char **kv = calloc((size_t)argc, sizeof *kv);
    int nkv = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--device=cuda") == 0)
            device = "cuda";
        else if (strncmp(argv[i], "--die=", 6) == 0)
            die_rank = atoi(argv[i] + 6), fault_in = strchr(argv[i], ':');
        else if (strncmp(argv[i], "--stall=", 8) == 0)
            stall_rank = atoi(argv[i] + 8), fault_in = strchr(argv[i], ':');
        else if (strcmp(argv[i], "--only-sendrecv") == 0)
            only_sendrecv = 1;
        else if (strcmp(argv[i], "--only-groups") == 0)
            only_groups = 1;
        else if (strncmp(argv[i], "--iterations=", 13) == 0)
            iterations = atoi(argv[i] + 13);
        else if (strncmp(argv[i], "--rs-tolerance=", 15) == 0)
            rs_tolerance = strtod(argv[i] + 15, NULL);
        else
            kv[nkv++] = argv[i];
    }
    if (die_rank >= world || stall_rank >= world)
        die("--die/--stall: rank %d does not exist among %d", die_rank >= world ? die_rank : stall_rank,
            world);
    if (fault_in) {
        static const char *const colls[] = {"allreduce", "reduce_scatter", "allgather",
                                            "broadcast", "sendrecv", "sendfar", "group"};
        int known = 0;
        for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++)
            known |= strcmp(fault_in + 1, colls[i]) == 0;
        if (!known)
            die("--die/--stall=R:COLL: COLL is allreduce, reduce_scatter, allgather, broadcast, "
                "sendrecv, sendfar or group, not '%s'",
                fault_in + 1);
        fault_in++;
        if (world < 2)
            die("--die/--stall=R:%s needs 2 ranks at least", fault_in);
        if (strcmp(fault_in, "sendfar") == 0 && world < 4)
            die("--die/--stall=R:sendfar needs 4 ranks at least (a peer two ranks away)");
        if ((die_rank >= 0) == (stall_rank >= 0))
            die("give one of --die=R:COLL and --stall=R:COLL");
    }
    if (strcmp(device, "cuda") == 0)
        use_gpu(local_rank);

    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        die("cannot load %s: %s", argv[1], dlerror());
    tr_plugin_entry_fn entry;
    *(void **)&entry = dlsym(lib, TR_PLUGIN_ENTRY_NAME);
    if (!entry)
        die("%s exports no %s", argv[1], TR_PLUGIN_ENTRY_NAME);
    const struct tr_plugin_info *info = entry();
    if (!info || info->abi_major != TR_ABI_MAJOR || info->kind != TR_KIND_COMM || !info->vtable)
        die("%s is not a comm plugin of ABI %d", argv[1], TR_ABI_MAJOR);
    vt = info->vtable;
    if (!HAS(allreduce_sum) || !HAS(broadcast))
        die("%s leaves a mandatory comm slot empty", argv[1]);

    void *config = parse_options(info, kv, nkv);
    struct tr_create_args args = {
        .struct_size = sizeof args,
        .run_dir = ".",
        .recipe_dir = ".",
        .seed = 1,
        .rank = rank,
        .world = world,
        .local_rank = local_rank,
        .local_world = local_world,
        .device = device,
        .device_stream = NULL,
    };
    tr_err err = {{0}};
    if (info->create(&host, config, &args, &self, &err) != TR_OK)
        die("create: %s", err.msg);
    if (rank == 0 && HAS(describe))
        printf("comm_check: %s\n", vt->describe(self));

    /* Like the core: created here, collectives from another thread. */
    if (fault_in && ((strcmp(fault_in, "allgather") == 0 && !HAS(allgather)) ||
                     (strcmp(fault_in, "reduce_scatter") == 0 && !HAS(reduce_scatter)) ||
                     (strncmp(fault_in, "send", 4) == 0 && !HAS(sendrecv)) ||
                     (strcmp(fault_in, "group") == 0 && !HAS(allreduce_group))))
        die("%s has no %s to fail inside", info->name, fault_in);
    struct checks todo = {die_rank, stall_rank,   iterations, only_sendrecv, only_groups,
                          fault_in, rs_tolerance, info->name};
    pthread_t comm_thread;
    if (pthread_create(&comm_thread, NULL, run_checks, &todo) != 0)
        die("cannot start the communication thread");
    pthread_join(comm_thread, NULL);

    if (info->destroy)
        info->destroy(self);
    free(config);
    free(kv);
    printf("comm_check rank %d/%d: PASS (%s)\n", rank, world, info->name);
    return 0;
}
