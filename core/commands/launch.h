/*
 * The local launcher: `trainrun recipe.lua procs=N` (or gpus=N) starts N
 * ranks of the same command on this machine, each told its place through
 * TRAINRUN_RANK, TRAINRUN_WORLD_SIZE, TRAINRUN_LOCAL_RANK,
 * TRAINRUN_LOCAL_WORLD_SIZE and TRAINRUN_MASTER, and supervises them:
 * SIGTERM, SIGUSR1 and SIGINT are passed on to every rank, and when one rank
 * dies the others are stopped (SIGTERM, then SIGKILL after a grace period)
 * and the launcher names the rank that died.  Cluster engines (Slurm, MPI,
 * Kubernetes) start the ranks themselves and do not use this.
 */
#ifndef TR_LAUNCH_H
#define TR_LAUNCH_H

/* Run `ranks` copies of argv (the original command line) and wait for
 * them.  Returns the job's exit code: 0 when every rank succeeded, 75 when
 * they were preempted (a checkpoint was saved), 1 when one failed. */
int tr_launch(int ranks, char *const *argv);

#endif
