/* trainrun: the command line.  main.c sets up the process (OpenMP's waits,
 * --plugin-path), dispatches to the subcommands and runs a recipe; cli.c
 * has the usage text and the reading of overrides and flags, subcommands.c
 * show, plugins, sample and export. */
#include "cli.h"
#include "../config/run_config.h"
#include "../config/options.h"
#include "../config/precision.h"
#include "../config/record.h"
#include "../engine/graph.h"
#include "../engine/model.h"
#include "plan.h"
#include "prepare.h"
#include "report.h"
#include "../engine/checkpoint.h"
#include "../engine/run.h"
#include "launch.h"
#include "doctor.h"
#include "eval.h"
#include "../engine/topo.h"
#include "../util/suggest.h"
#include "../util/util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char **original_argv;

static int cmd_run(int argc, char **argv, int first)
{
    const char *recipe = argv[first];
    struct tr_run_flags flags = {0, 0, 0, 0};
    for (int i = first + 1; i < argc; i++) {
        if (strcmp(argv[i], "--resume") == 0 || strncmp(argv[i], "--resume=", 9) == 0) {
            int joined = argv[i][8] == '='; /* --resume=auto */
            const char *how = joined ? argv[i] + 9 : i + 1 < argc ? argv[i + 1] : NULL;
            if (!how || !*how) {
                fprintf(stderr, "trainrun: error: --resume needs a value: --resume auto or "
                                "--resume never\n");
                return TR_EXIT_USAGE;
            }
            if (strcmp(how, "auto") == 0)
                flags.resume = 1;
            else if (strcmp(how, "never") != 0) {
                fprintf(stderr, "trainrun: error: --resume takes auto or never, not '%s'\n", how);
                return TR_EXIT_USAGE;
            }
            argv[i] = "-"; /* consumed, with its value */
            if (!joined)
                argv[++i] = "-";
        } else if (strcmp(argv[i], "--quiet") == 0) {
            flags.quiet = 1;
            argv[i] = "-";
        } else if (strcmp(argv[i], "--allow-changes") == 0) {
            flags.allow_changes = 1;
            argv[i] = "-";
        } else if (strcmp(argv[i], "--smoke") == 0) {
            flags.smoke = 1;
            argv[i] = "-";
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "trainrun: error: unknown flag '%s' (see trainrun help)\n", argv[i]);
            return TR_EXIT_USAGE;
        }
    }
    const char **overrides;
    int n;
    if (tr_cli_overrides(argc, argv, first + 1, &overrides, &n) != 0) {
        free(overrides);
        return TR_EXIT_USAGE;
    }
    if (flags.smoke) {
        int code = tr_smoke(recipe, overrides, n, flags.quiet, tr_launch);
        free(overrides);
        return code;
    }
    struct tr_config cfg;
    tr_err err = {{0}};
    int code;
    if (tr_config_load(&cfg, recipe, overrides, n, &err) != TR_OK) {
        fprintf(stderr, "trainrun: error: %s\n", err.msg);
        code = TR_EXIT_ERROR;
    } else if (!cfg.rank.source && (cfg.parallel.procs > 1 || cfg.parallel.gpus > 1)) {
        /* procs=N / gpus=N: become the launcher of N ranks of this command */
        code = tr_launch((int)tr_config_ranks(&cfg), original_argv);
    } else {
        code = tr_train(&cfg, &flags);
    }
    tr_config_free(&cfg);
    free(overrides);
    return code;
}

/*
 * How OpenMP's idle threads wait between parallel regions.  A step runs
 * hundreds of short regions (every GEMM, every elementwise op), and a thread
 * that sleeps at once between them (OMP_WAIT_POLICY=passive) costs 60-90 us
 * to wake for the next one on a virtual machine: 2 threads, an empty region
 * of 20 us of work took 70 us passive and 20-27 us with a short spin (Zen 4).
 * Spinning long (libgomp's default spins some 300000 iterations, about 12 ms
 * on that CPU, then sleeps; OMP_WAIT_POLICY=active never sleeps) steals the
 * cores from the threads doing work -- the loader, the checkpoint writer,
 * other processes.  So trainrun asks for a short spin, about 0.2-0.5 ms
 * (libgomp: GOMP_SPINCOUNT=10000; LLVM's libomp: KMP_BLOCKTIME=1, in ms),
 * then sleep.  Measured on the 2-core Zen 4 (docs/results.md, "How idle
 * threads wait"): the KJV recipe's 100 steps 16.1-16.7 s passive against
 * 15.0-15.2 s; its 60 steps with two busy loops on both cores 26.3-26.4 s
 * passive, 19.3-22.1 s with the short spin, 30.7-34.8 s with libgomp's
 * default spin.  libgomp reads the settings before main(), so set them and
 * start again, once, unless the user chose (any of tr_openmp_waits, in
 * doctor.c with the values, set in the environment).
 */
static void prefer_short_spin_openmp(char **argv)
{
    for (int i = 0; i < TR_OPENMP_WAITS; i++)
        if (getenv(tr_openmp_waits[i].name) != NULL)
            return;
    for (int i = 0; i < TR_OPENMP_WAITS; i++)
        if (tr_openmp_waits[i].short_spin != NULL)
            setenv(tr_openmp_waits[i].name, tr_openmp_waits[i].short_spin, 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the runtime's default policy */
}

/* --plugin-path DIR (or --plugin-path=DIR), anywhere on the command line and
 * repeatable: the user's own plugin directories, searched after the built-in
 * one and before TRAINRUN_PLUGIN_PATH's.  They are taken out of argv and
 * passed on through TRAINRUN_PLUGIN_PATH, so that every command and every
 * rank a launcher starts sees them.  Returns the new argc, or -1. */
static int take_plugin_paths(int argc, char **argv)
{
    char *dirs = NULL;
    int out = 1;
    for (int i = 1; i < argc; i++) {
        const char *dir = NULL;
        if (strcmp(argv[i], "--plugin-path") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainrun: error: --plugin-path needs a directory\n");
                free(dirs);
                return -1;
            }
            dir = argv[++i];
        } else if (strncmp(argv[i], "--plugin-path=", 14) == 0) {
            dir = argv[i] + 14;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        struct stat st;
        if (!*dir || strchr(dir, ':') || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "trainrun: error: --plugin-path '%s' is not a directory%s\n", dir,
                    strchr(dir, ':') ? " (give one directory per --plugin-path)" : "");
            free(dirs);
            return -1;
        }
        char abs[PATH_MAX];
        if (realpath(dir, abs)) /* ranks and plugins see the same directory */
            dir = abs;
        char *more = dirs ? tr_xasprintf("%s:%s", dirs, dir) : tr_xstrdup(dir);
        free(dirs);
        dirs = more;
    }
    argv[out] = NULL;
    if (dirs) {
        const char *env = getenv("TRAINRUN_PLUGIN_PATH");
        char *path = env && *env ? tr_xasprintf("%s:%s", dirs, env) : tr_xstrdup(dirs);
        setenv("TRAINRUN_PLUGIN_PATH", path, 1);
        free(path);
        free(dirs);
    }
    return out;
}

static const char *const commands[] = {"run",    "show",   "plan",   "plugins", "sample",
                                       "export", "eval", "prepare", "report", "topo",    "doctor",
                                       "help",   "version", NULL};

/* `trainrun shwo x.lua` is a mistyped command, not a recipe named "shwo":
 * a recipe is an existing file, or a name ending in .lua or holding a '/'. */
static int looks_like_recipe(const char *arg)
{
    size_t n = strlen(arg);
    return access(arg, F_OK) == 0 || strchr(arg, '/') ||
           (n > 4 && strcmp(arg + n - 4, ".lua") == 0);
}

/* trainrun help [recipe|eval|sample|prepare] (also --help, -h) */
static int cmd_help(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[2], "recipe") == 0)
        tr_config_help(stdout);
    else if (argc > 2 && strcmp(argv[2], "eval") == 0)
        tr_eval_help(stdout);
    else if (argc > 2 && strcmp(argv[2], "sample") == 0)
        tr_sample_help(stdout);
    else if (argc > 2 && strcmp(argv[2], "prepare") == 0)
        tr_prepare_help(stdout);
    else
        tr_cli_usage(stdout);
    return TR_EXIT_OK;
}

/* trainrun plan: its gpus=N and overrides checked here, the rest by plan. */
static int cmd_plan(int argc, char **argv)
{
    for (int i = 3; i < argc; i++) { /* plan parses the rest itself */
        long long gpus;
        int bad = strncmp(argv[i], "gpus=", 5) == 0
                      ? tr_cli_flag_int("gpus=N", argv[i] + 5, 1, 1048576, &gpus) != 0
                      : argv[i][0] != '-' && strchr(argv[i], '=') &&
                            !tr_cli_override_ok(argv[i], "plan: ");
        if (bad)
            return TR_EXIT_USAGE;
    }
    return tr_plan_main(argc - 1, argv + 1);
}

static int cmd_doctor(int argc, char **argv)
{
    (void)argc, (void)argv;
    struct tr_plugin_path search;
    tr_plugin_path_init(&search, tr_install_paths()->plugin_dir);
    int problems = tr_doctor(stdout, &search);
    tr_plugin_path_free(&search);
    return problems ? TR_EXIT_ERROR : TR_EXIT_OK;
}

/* trainrun --smoke RECIPE.lua ...: the run's flag, given first. */
static int cmd_smoke(int argc, char **argv)
{
    if (argc < 3 || argv[2][0] == '-') {
        fprintf(stderr, "trainrun: error: --smoke needs a recipe: trainrun --smoke "
                        "RECIPE.lua\n");
        return TR_EXIT_USAGE;
    }
    argv[1] = argv[2]; /* trainrun --smoke recipe.lua ... */
    argv[2] = "--smoke";
    return cmd_run(argc, argv, 1);
}

static int cmd_version(int argc, char **argv)
{
    (void)argc, (void)argv;
    printf("trainrun %s (plugin ABI %d)\n", PACKAGE_VERSION, TR_ABI_MAJOR);
    return TR_EXIT_OK;
}

/* trainrun run RECIPE.lua ...: as trainrun RECIPE.lua ... */
static int cmd_run_named(int argc, char **argv)
{
    if (argc < 3) {
        tr_cli_usage(stderr);
        return TR_EXIT_USAGE;
    }
    return cmd_run(argc, argv, 2);
}

/* The subcommands by name; `shift`: the command reads argv from its own
 * name on (argc - 1, argv + 1) rather than main's. */
static const struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    int shift;
} subcommands[] = {
    {"version", cmd_version, 0},   {"--version", cmd_version, 0},
    {"show", tr_cmd_show, 0},      {"plugins", tr_cmd_plugins, 0},
    {"sample", tr_cmd_sample, 0},  {"export", tr_cmd_export, 0},
    {"eval", tr_eval_main, 1},     {"plan", cmd_plan, 0},
    {"topo", tr_topo_main, 1},     {"doctor", cmd_doctor, 0},
    {"report", tr_report_main, 1}, {"prepare", tr_prepare_main, 1},
    {"run", cmd_run_named, 0},     {"--smoke", cmd_smoke, 0},
};

static const struct subcommand *find_subcommand(const char *cmd)
{
    for (size_t i = 0; i < TR_ARRAY_LEN(subcommands); i++)
        if (strcmp(subcommands[i].name, cmd) == 0)
            return &subcommands[i];
    return NULL;
}

/* Neither a command nor a recipe: a flag out of place, a mistyped command,
 * an override before any recipe.  Returns the usage exit, or TR_EXIT_OK
 * when cmd may be a recipe. */
static int not_a_command(const char *cmd)
{
    if (strcmp(cmd, "--resume") == 0 || strcmp(cmd, "--quiet") == 0) {
        fprintf(stderr, "trainrun: error: %s goes after the recipe: trainrun RECIPE.lua %s\n", cmd,
                strcmp(cmd, "--resume") == 0 ? "--resume auto" : "--quiet");
        return TR_EXIT_USAGE;
    }
    if (cmd[0] == '-') {
        fprintf(stderr, "trainrun: error: unknown flag '%s'\n", cmd);
        tr_cli_usage(stderr);
        return TR_EXIT_USAGE;
    }
    if (looks_like_recipe(cmd))
        return TR_EXIT_OK;
    const char *hint = tr_suggest(cmd, commands, TR_ARRAY_LEN(commands) - 1);
    if (strchr(cmd, '='))
        fprintf(stderr, "trainrun: error: '%s' is an override, but no recipe comes before "
                        "it: trainrun RECIPE.lua %s\n", cmd, cmd);
    else if (hint)
        fprintf(stderr, "trainrun: error: unknown command '%s' (did you mean '%s'?)\n", cmd,
                hint);
    else
        fprintf(stderr, "trainrun: error: '%s' is neither a command nor a recipe file (see "
                        "trainrun help)\n", cmd);
    return TR_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    prefer_short_spin_openmp(argv);
    argc = take_plugin_paths(argc, argv);
    if (argc < 0)
        return TR_EXIT_USAGE;
    /* commands mark the arguments they consume; the launcher needs them as given */
    original_argv = tr_xcalloc((size_t)argc + 1, sizeof *original_argv);
    memcpy(original_argv, argv, (size_t)argc * sizeof *argv);
    if (argc < 2) {
        tr_cli_usage(stderr);
        return TR_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        return cmd_help(argc, argv);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 ||
        strcmp(cmd, "doctor") == 0) {
        if (argc > 2) {
            fprintf(stderr, "trainrun: error: %s takes no arguments, not '%s'\n", cmd, argv[2]);
            return TR_EXIT_USAGE;
        }
    }
    const struct subcommand *sub = find_subcommand(cmd);
    if (sub)
        return sub->run(argc - sub->shift, argv + sub->shift);
    int code = not_a_command(cmd);
    return code == TR_EXIT_USAGE ? code : cmd_run(argc, argv, 1);
}
