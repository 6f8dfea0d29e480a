/*
 * The rendezvous the nccl comm plugin uses to hand NCCL's unique id from
 * rank 0 to the others (plugins/comm/rendezvous.h), run on real processes:
 * over TRAINRUN_MASTER (TCP) and TRAINRUN_RENDEZVOUS_FILE, with a stale
 * file of another job ignored and bad settings refused.  No GPU needed: the
 * blob is any 128 bytes.
 *
 * Covers: plugins/comm/rendezvous.h.
 */
#include <criterion/criterion.h>

#include "../plugins/comm/rendezvous.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <sys/wait.h>

#define BLOB 128

static void pattern(unsigned char *b)
{
    for (int i = 0; i < BLOB; i++)
        b[i] = (unsigned char)(i * 37 + 11);
}

/* A free TCP port on this machine. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sin;
    cr_assert(bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0);
    cr_assert(getsockname(fd, (struct sockaddr *)&sin, &len) == 0);
    close(fd);
    return ntohs(sin.sin_port);
}

/* One rank: 0 shares the pattern, the others must receive it.  Exit code
 * 0: the blob arrived intact; 1: it did not; 2: rdv_share failed. */
static int rank_main(int rank, int world, double timeout)
{
    unsigned char blob[BLOB], want[BLOB];
    pattern(want);
    if (rank == 0)
        memcpy(blob, want, BLOB);
    else
        memset(blob, 0, BLOB);
    char via[128];
    tr_err err = {{0}};
    if (rdv_share("test", blob, BLOB, rank, world, timeout, via, sizeof via, &err) != TR_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return 2;
    }
    return memcmp(blob, want, BLOB) == 0 ? 0 : 1;
}

/* Run `world` ranks as processes (rank 0 last, so the others wait for it);
 * returns the worst exit code. */
static int run_ranks(int world, double timeout)
{
    pid_t pids[8];
    for (int r = world - 1; r >= 0; r--) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(rank_main(r, world, timeout));
        if (r > 0)
            usleep(20 * 1000);
    }
    int worst = 0;
    for (int r = 0; r < world; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
        worst = code > worst ? code : worst;
    }
    return worst;
}

static void clear_env(void)
{
    unsetenv("TRAINRUN_MASTER");
    unsetenv("TRAINRUN_RENDEZVOUS_FILE");
    unsetenv("TRAINRUN_JOB_ID");
    unsetenv("SLURM_JOB_ID");
    unsetenv("PBS_JOBID");
}

TestSuite(rendezvous, .init = clear_env);

Test(rendezvous, tcp_hands_rank0s_blob_to_every_rank)
{
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    setenv("TRAINRUN_MASTER", master, 1);
    cr_assert_eq(run_ranks(4, 20), 0, "a rank did not get rank 0's blob over TCP");
}

Test(rendezvous, shared_file_hands_rank0s_blob_to_every_rank)
{
    char path[] = "/tmp/trainrun-rdv-XXXXXX";
    cr_assert_not_null(mkdtemp(path));
    char file[128];
    snprintf(file, sizeof file, "%s/id", path);
    setenv("TRAINRUN_RENDEZVOUS_FILE", file, 1);
    setenv("TRAINRUN_JOB_ID", "job-42", 1);
    cr_assert_eq(run_ranks(3, 20), 0, "a rank did not get rank 0's blob through the file");
    struct stat st;
    cr_assert_neq(stat(file, &st), 0, "rank 0 should remove the file once every rank has it");
    rmdir(path);
}

Test(rendezvous, a_file_left_by_another_job_is_not_taken)
{
    char path[] = "/tmp/trainrun-rdv-XXXXXX";
    cr_assert_not_null(mkdtemp(path));
    char file[128];
    snprintf(file, sizeof file, "%s/id", path);
    setenv("TRAINRUN_RENDEZVOUS_FILE", file, 1);
    /* job 1's rank 0 publishes and dies before the others read */
    setenv("TRAINRUN_JOB_ID", "job-1", 1);
    unsigned char stale[BLOB];
    memset(stale, 0xAB, BLOB);
    tr_err err = {{0}};
    cr_assert_eq(rdv_file_publish("test", file, stale, BLOB, 2, &err), TR_OK, "%s", err.msg);
    /* job 2's rank 1 must not take it: alone, it times out */
    setenv("TRAINRUN_JOB_ID", "job-2", 1);
    unsigned char blob[BLOB] = {0};
    char via[128];
    cr_assert_eq(rdv_share("test", blob, BLOB, 1, 2, 1.0, via, sizeof via, &err), TR_ERROR);
    for (int i = 0; i < BLOB; i++)
        cr_assert_eq(blob[i], 0, "job 2 took job 1's blob");
    remove(file);
    rmdir(path);
}

Test(rendezvous, bad_settings_are_refused_with_the_fix)
{
    unsigned char blob[BLOB] = {0};
    char via[128];
    tr_err err = {{0}};
    cr_assert_eq(rdv_share("comm nccl", blob, BLOB, 1, 2, 1.0, via, sizeof via, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "set TRAINRUN_MASTER=host:port"), "%s", err.msg);
    setenv("TRAINRUN_MASTER", "node01", 1);
    cr_assert_eq(rdv_share("comm nccl", blob, BLOB, 1, 2, 1.0, via, sizeof via, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "is not host:port"), "%s", err.msg);
}

Test(rendezvous, a_missing_rank0_ends_in_the_timeout)
{
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    setenv("TRAINRUN_MASTER", master, 1);
    unsigned char blob[BLOB] = {0};
    char via[128];
    tr_err err = {{0}};
    double t0 = rdv_now();
    cr_assert_eq(rdv_share("comm nccl", blob, BLOB, 1, 2, 1.0, via, sizeof via, &err), TR_ERROR);
    cr_assert_lt(rdv_now() - t0, 5.0, "gave up after %.1f s, timeout 1 s", rdv_now() - t0);
    cr_assert(err.msg[0], "no message");
}
