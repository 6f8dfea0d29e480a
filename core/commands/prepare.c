/*
 * `trainrun prepare` (see prepare.h): its help, its command line, and the
 * choice of format, each of which the dataset room carries out
 * (core/dataset/dataset.h): text inputs become token shards, CSV inputs are
 * checked and cleaned, instruction data becomes masked shards, image
 * folders and tars become image shards.
 */
#include "prepare.h"

#include "../dataset/dataset.h"
#include "../engine/run.h"
#include "../util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The help up to the image options: the formats, and the options of text and CSV. */
static void help_text(FILE *out)
{
    fprintf(out,
            "usage: trainrun prepare INPUT... -o OUTDIR [options]\n"
            "\n"
            "Text inputs become token shards for data = { plugin = \"tokens\", ... }:\n"
            "  OUTDIR/train_000000.bin ..., OUTDIR/val_000000.bin ..., OUTDIR/prepare.json\n"
            "  (and OUTDIR/tokenizer.json when --tokenizer names one)\n"
            "Text inputs are .txt (documents split by --doc-separator) or .jsonl (one JSON\n"
            "object per line, one document per record: its --text-field string); either may\n"
            "be gzip- or zstd-compressed (.gz, .zst).\n"
            "CSV inputs are checked and cleaned into OUTDIR/data.csv for the csv plugin.\n"
            "Image folders (one subdirectory per class) and WebDataset tar shards become\n"
            "image shards for data = { plugin = \"images\", ... }: OUTDIR/train_000000.bin,\n"
            "OUTDIR/val_000000.bin, OUTDIR/classes.txt, OUTDIR/prepare.json.\n"
            "\n"
            "  -o, --out DIR            output directory (created if missing)\n"
            "  --format text|csv|instruct|images\n"
            "                           default: csv when every input ends in .csv or\n"
            "                           .csv.gz, images when every input is a folder or a\n"
            "                           .tar, else text; instruct is never guessed:\n"
            "                           JSONL of {\"prompt\", \"response\"} or chat\n"
            "                           {\"messages\": [{\"role\", \"content\"}, ...]} records\n"
            "                           into shards with a loss mask that trains on the\n"
            "                           responses (and assistant turns) only; needs\n"
            "                           --tokenizer FILE, and for messages the ChatML or\n"
            "                           Llama 3 chat_template of the tokenizer_config.json\n"
            "                           beside it, rendered and tokenized as transformers'\n"
            "                           apply_chat_template does (see docs/data.md,\n"
            "                           Instruction data)\n"
            "  --tokenizer byte|char|FILE\n"
            "                           byte: vocabulary 256 (default); char: the distinct\n"
            "                           bytes of the kept documents, sorted; FILE: a Hugging\n"
            "                           Face tokenizer.json (or a model directory holding\n"
            "                           one), copied into OUTDIR with the\n"
            "                           tokenizer_config.json beside it\n"
            "  --train-tokenizer N      train a byte-level BPE of N tokens (<|endoftext|>,\n"
            "                           the 256 bytes, merges; at least 257) on the training\n"
            "                           documents (after dedup, without the validation ones),\n"
            "                           write it as OUTDIR/tokenizer.json and encode with it\n"
            "                           (as the tokenizers library's BpeTrainer would)\n"
            "  --eos TOKEN|none         tokenizer.json: the token after each document\n"
            "                           (default: tokenizer_config.json's eos_token, else\n"
            "                           <|endoftext|>, <|end_of_text|> or </s>)\n"
            "  --workers N              tokenizer.json: threads that encode documents\n"
            "                           (default: the online CPUs); the shards are the\n"
            "                           same for every N\n"
            "  --text-field NAME        JSONL: the string field of each record that holds\n"
            "                           the document (default text)\n"
            "  --skip-bad-records       JSONL: skip records that are not JSON objects or lack\n"
            "                           a string text field (counted, the first %d shown)\n"
            "                           instead of stopping at the first with its file:line\n"
            "  --shard-tokens N         tokens per shard (default 100000000)\n"
            "  --val-fraction F         share for validation, whole documents from the end:\n"
            "                           of the tokens (byte, char) or of the text bytes\n"
            "                           (tokenizer.json) (default 0.05; 0: none)\n"
            "  --dedup exact|near|none  exact: same text up to case and whitespace;\n"
            "                           near: also MinHash-similar documents (default exact)\n"
            "  --near-threshold T       near: drop a document whose estimated Jaccard\n"
            "                           similarity to an earlier one is >= T (default 0.8)\n"
            "  --doc-separator blank-line|line\n"
            "                           .txt documents are paragraphs (default) or lines;\n"
            "                           byte and char put the separator after each document\n"
            "  --header                 CSV: the first line of each input names the columns\n"
            "\n",
            SAMPLES_SHOWN);
}

/* The options of --format images, and the help's last lines. */
static void help_images(FILE *out)
{
    fprintf(out,
            "Images (--format images; see docs/data.md, Images):\n"
            "  --size N                 required: every image is resized so that its shorter\n"
            "                           side is N, then its centre N x N kept\n"
            "  --channels 3|1           RGB (default) or grey\n"
            "  --val DIR|TAR            validation images (repeatable), instead of a\n"
            "                           --val-fraction of the inputs (chosen by a hash of\n"
            "                           each file's name)\n"
            "  --augment-copies N       offline augmentation: N extra copies of each\n"
            "                           training image, randomly cropped from it padded by\n"
            "                           --augment-pad zeros (default N/8 of --size)\n"
            "  --augment-flip           the copies are also mirrored at random\n"
            "  --seed N                 the copies' draws and the split's hash (default 0)\n"
            "  --shard-images N         images per shard (default: about 1 GiB of pixels)\n"
            "  --workers N              threads that decode (default: the online CPUs); the\n"
            "                           shards are the same for every N\n"
            "  --skip-bad-records       also: skip images that do not decode (counted, the\n"
            "                           first %d named) instead of stopping at the first\n"
            "\n"
            "A progress bar (MB/s, ETA) is drawn on stderr when it is a terminal.\n"
            "See docs/data.md.\n",
            SAMPLES_SHOWN);
}

void tr_prepare_help(FILE *out)
{
    help_text(out);
    help_images(out);
}

/* ---- the command ------------------------------------------------------------ */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int one_of(const char *flag, const char *value, const char *a, const char *b,
                  const char *c)
{
    if (strcmp(value, a) == 0 || strcmp(value, b) == 0 || (c && strcmp(value, c) == 0))
        return 1;
    fprintf(stderr, "trainrun prepare: error: %s must be %s, %s%s%s, not '%s'\n", flag, a, b,
            c ? " or " : "", c ? c : "", value);
    return 0;
}

/* The flags that take no value: 1 when a is one (and set), else 0. */
static int switch_flag(struct prepare_opts *o, const char *a)
{
    if (strcmp(a, "--header") == 0)
        o->header = 1;
    else if (strcmp(a, "--skip-bad-records") == 0)
        o->skip_bad_records = 1;
    else if (strcmp(a, "--augment-flip") == 0)
        o->augment_flip = 1;
    else
        return 0;
    return 1;
}

/* argv[*i] as a known --flag value or --flag=value: its name (in name[64]) and *value;
 * *i moves past a value given apart.  TR_EXIT_OK, or TR_EXIT_USAGE with the message. */
static int flag_and_value(int argc, char **argv, int *i, char name[64], const char **value)
{
    static const char *const known[] = {"-o", "--out", "--format", "--tokenizer", "--dedup",
                                        "--doc-separator", "--shard-tokens",
                                        "--val-fraction", "--near-threshold",
                                        "--text-field", "--eos", "--workers",
                                        "--train-tokenizer", "--val", "--size",
                                        "--channels", "--augment-copies", "--augment-pad",
                                        "--seed", "--shard-images"};
    const char *a = argv[*i];
    const char *eq = strchr(a, '=');
    snprintf(name, 64, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
    int is_known = 0;
    for (size_t k = 0; k < TR_ARRAY_LEN(known); k++)
        is_known |= strcmp(name, known[k]) == 0;
    if (!is_known) {
        fprintf(stderr, "trainrun prepare: error: unknown option '%s' (see trainrun "
                        "prepare --help)\n", name);
        return TR_EXIT_USAGE;
    }
    if (eq) {
        *value = eq + 1;
    } else {
        if (*i + 1 >= argc) {
            fprintf(stderr, "trainrun prepare: error: %s needs a value\n", a);
            return TR_EXIT_USAGE;
        }
        *value = argv[++*i];
    }
    return TR_EXIT_OK;
}

/* --val, --size, --augment-copies, --augment-pad, --channels, --seed, --shard-images. */
static int is_image_flag(const char *name)
{
    static const char *const image[] = {"--val", "--size", "--augment-copies", "--augment-pad",
                                        "--channels", "--seed", "--shard-images"};
    for (size_t k = 0; k < TR_ARRAY_LEN(image); k++)
        if (strcmp(name, image[k]) == 0)
            return 1;
    return 0;
}

/* One of is_image_flag's flags and its value into o: TR_EXIT_OK or TR_EXIT_USAGE. */
static int image_flag(struct prepare_opts *o, const char *name, const char *value)
{
    char *end;
    if (strcmp(name, "--val") == 0) {
        o->val_inputs[o->n_val_inputs++] = value;
    } else if (strcmp(name, "--seed") == 0 || strcmp(name, "--shard-images") == 0) {
        errno = 0;
        unsigned long long v = strtoull(value, &end, 10);
        int shard = strcmp(name, "--shard-images") == 0;
        if (end == value || *end || errno || value[0] == '-' || (shard && v < 1)) {
            fprintf(stderr, "trainrun prepare: error: %s must be an integer of at least "
                            "%d, not '%s'\n", name, shard, value);
            return TR_EXIT_USAGE;
        }
        *(shard ? &o->shard_images : &o->seed) = v;
    } else { /* --size, --augment-copies, --augment-pad, --channels */
        long v = strtol(value, &end, 10);
        int size = strcmp(name, "--size") == 0, copies = strcmp(name, "--augment-copies") == 0;
        int channels = strcmp(name, "--channels") == 0;
        long lo = size ? 1 : 0, hi = size ? 4096 : copies ? 1000 : 1024;
        if (end == value || *end || v < lo || v > hi || (channels && v != 1 && v != 3)) {
            if (channels)
                fprintf(stderr, "trainrun prepare: error: --channels must be 3 (RGB) or 1 "
                                "(grey), not '%s'\n", value);
            else
                fprintf(stderr, "trainrun prepare: error: %s must be an integer from %ld to "
                                "%ld, not '%s'\n", name, lo, hi, value);
            return TR_EXIT_USAGE;
        }
        *(size ? &o->image_size : copies ? &o->augment_copies
          : channels ? &o->channels : &o->augment_pad) = (int)v;
    }
    return TR_EXIT_OK;
}

/* --train-tokenizer, --workers, --shard-tokens, --val-fraction, --near-threshold: their
 * number into o.  TR_EXIT_OK or TR_EXIT_USAGE. */
static int number_flag(struct prepare_opts *o, const char *name, const char *value)
{
    char *end;
    if (strcmp(name, "--train-tokenizer") == 0) {
        errno = 0;
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || errno || value[0] == '-' || v < 257 || v > (1u << 24)) {
            fprintf(stderr, "trainrun prepare: error: --train-tokenizer must be a vocabulary "
                            "size from 257 (<|endoftext|> and the 256 bytes) to %u, not '%s'\n",
                    1u << 24, value);
            return TR_EXIT_USAGE;
        }
        o->train_tokenizer = v;
    } else if (strcmp(name, "--workers") == 0) {
        long v = strtol(value, &end, 10);
        if (end == value || *end || v < 1 || v > 256) {
            fprintf(stderr, "trainrun prepare: error: --workers must be an integer from 1 "
                            "to 256, not '%s'\n", value);
            return TR_EXIT_USAGE;
        }
        o->workers = (int)v;
    } else if (strcmp(name, "--shard-tokens") == 0) {
        errno = 0;
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || errno || v < 2 || value[0] == '-') {
            fprintf(stderr, "trainrun prepare: error: --shard-tokens must be an integer "
                            "of at least 2, not '%s'\n", value);
            return TR_EXIT_USAGE;
        }
        o->shard_tokens = v;
    } else if (strcmp(name, "--val-fraction") == 0) {
        double v = strtod(value, &end);
        if (end == value || *end || !(v >= 0 && v < 1)) {
            fprintf(stderr, "trainrun prepare: error: --val-fraction must be a number in "
                            "[0, 1), not '%s'\n", value);
            return TR_EXIT_USAGE;
        }
        o->val_fraction = v;
        o->val_fraction_set = 1;
    } else { /* --near-threshold */
        double v = strtod(value, &end);
        if (end == value || *end || !(v > 0 && v <= 1)) {
            fprintf(stderr, "trainrun prepare: error: --near-threshold must be a number in "
                            "(0, 1], not '%s'\n", value);
            return TR_EXIT_USAGE;
        }
        o->near_threshold = v;
    }
    return TR_EXIT_OK;
}

/* A known flag and its value into o: TR_EXIT_OK or TR_EXIT_USAGE. */
static int flag_value(struct prepare_opts *o, const char *name, const char *value)
{
    if (strcmp(name, "-o") == 0 || strcmp(name, "--out") == 0) {
        o->out_dir = value;
    } else if (strcmp(name, "--format") == 0) {
        if (strcmp(value, "images") != 0 && !one_of(name, value, "text", "csv", "instruct"))
            return TR_EXIT_USAGE;
        o->format = value;
    } else if (is_image_flag(name)) {
        return image_flag(o, name, value);
    } else if (strcmp(name, "--tokenizer") == 0) {
        if (!*value) {
            fprintf(stderr, "trainrun prepare: error: --tokenizer must be byte, char or the "
                            "path of a tokenizer.json\n");
            return TR_EXIT_USAGE;
        }
        o->tokenizer = value;
    } else if (strcmp(name, "--text-field") == 0) {
        if (!*value) {
            fprintf(stderr, "trainrun prepare: error: --text-field needs a field name\n");
            return TR_EXIT_USAGE;
        }
        o->text_field = value;
    } else if (strcmp(name, "--eos") == 0) {
        if (!*value) {
            fprintf(stderr, "trainrun prepare: error: --eos needs a token (or none)\n");
            return TR_EXIT_USAGE;
        }
        o->eos = value;
    } else if (strcmp(name, "--dedup") == 0) {
        if (!one_of(name, value, "exact", "near", "none"))
            return TR_EXIT_USAGE;
        o->dedup = value;
    } else if (strcmp(name, "--doc-separator") == 0) {
        if (!one_of(name, value, "blank-line", "line", NULL))
            return TR_EXIT_USAGE;
        o->doc_separator = value;
    } else {
        return number_flag(o, name, value);
    }
    return TR_EXIT_OK;
}

/* Parse the command line; TR_EXIT_OK to go on, else the exit code. */
static int parse_args(int argc, char **argv, struct prepare_opts *o, int *help)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = 1;
            return TR_EXIT_OK;
        }
        if (a[0] != '-') {
            o->inputs[o->n_inputs++] = a;
            continue;
        }
        if (switch_flag(o, a))
            continue;
        char name[64];
        const char *value;
        int code = flag_and_value(argc, argv, &i, name, &value);
        if (code == TR_EXIT_OK)
            code = flag_value(o, name, value);
        if (code != TR_EXIT_OK)
            return code;
    }
    return TR_EXIT_OK;
}

#define GO_ON (-1) /* not an exit code: the command goes on */

/* The command line read and checked as a whole: GO_ON, or the exit code (after --help). */
static int read_command_line(int argc, char **argv, struct prepare_opts *o)
{
    int help = 0;
    int code = parse_args(argc, argv, o, &help);
    if (code != TR_EXIT_OK || help) {
        if (help)
            tr_prepare_help(stdout);
        return code;
    }
    if (o->n_inputs == 0 || !o->out_dir) {
        fprintf(stderr, "trainrun prepare: error: %s\n",
                o->n_inputs == 0 ? "name at least one input file" : "name the output directory "
                                                                    "with -o OUTDIR");
        tr_prepare_help(stderr);
        return TR_EXIT_USAGE;
    }
    if (strlen(o->out_dir) > 3000) {
        fprintf(stderr, "trainrun prepare: error: the output directory's path is too long\n");
        return TR_EXIT_USAGE;
    }
    return GO_ON;
}

/* --format left out: csv when every input is a CSV file, images when every input is a
 * folder or a tar, else text. */
static void guess_format(struct prepare_opts *o)
{
    int all_csv = 1, all_images = 1;
    for (int i = 0; i < o->n_inputs; i++) {
        all_csv &= ends_with(o->inputs[i], ".csv") || ends_with(o->inputs[i], ".csv.gz");
        all_images &= tr_prepare_is_image_input(o->inputs[i]);
    }
    o->format = all_csv ? "csv" : all_images ? "images" : "text";
}

/* --format images, or the image flags refused with another format: an exit code, or GO_ON
 * for the other formats. */
static int images_or_go_on(struct prepare_opts *o)
{
    int images = strcmp(o->format, "images") == 0;
    if (!images && (o->image_size || o->n_val_inputs || o->augment_copies || o->augment_flip ||
                    o->augment_pad >= 0 || o->channels != 3 || o->seed || o->shard_images)) {
        fprintf(stderr, "trainrun prepare: error: --size, --channels, --val, --augment-*, --seed "
                        "and --shard-images go with --format images (image folders or tar "
                        "shards), not --format %s\n", o->format);
        return TR_EXIT_USAGE;
    }
    if (!images)
        return GO_ON;
    if (o->n_val_inputs && o->val_fraction_set) {
        fprintf(stderr, "trainrun prepare: error: --val names the validation images: leave "
                        "out --val-fraction\n");
        return TR_EXIT_USAGE;
    }
    if (o->augment_pad < 0)
        o->augment_pad = o->image_size / 8;
    return tr_prepare_images(o) == 0 ? TR_EXIT_OK : TR_EXIT_ERROR;
}

/* --train-tokenizer (text only: then o->tokenizer is the file it will write, *trained, to
 * free) and --eos (with a tokenizer.json only): GO_ON or TR_EXIT_USAGE. */
static int check_tokenizer_flags(struct prepare_opts *o, char **trained)
{
    if (o->train_tokenizer) {
        if (strcmp(o->format, "text") != 0 || strcmp(o->tokenizer, "byte") != 0) {
            fprintf(stderr, "trainrun prepare: error: --train-tokenizer makes the tokenizer of "
                            "text inputs: leave out %s\n",
                    strcmp(o->format, "csv") == 0 ? "--format csv (or the .csv inputs)"
                    : strcmp(o->format, "instruct") == 0
                        ? "--format instruct (instruction data is encoded with the model's own "
                          "tokenizer: train one on text first, then pass it with --tokenizer)"
                        : "--tokenizer");
            return TR_EXIT_USAGE;
        }
        /* the trained file, then the tokenizer.json path as for --tokenizer FILE */
        o->tokenizer = *trained = tr_xasprintf("%s/tokenizer.json", o->out_dir);
    }
    if (o->eos && (strcmp(o->format, "csv") == 0 || strcmp(o->tokenizer, "byte") == 0 ||
                   strcmp(o->tokenizer, "char") == 0)) {
        fprintf(stderr, "trainrun prepare: error: --eos goes with --tokenizer FILE (a "
                        "tokenizer.json); byte and char tokens put the document separator "
                        "after each document\n");
        return TR_EXIT_USAGE;
    }
    return GO_ON;
}

/* The command line, then the format's pipeline (core/dataset/). */
static int prepare(int argc, char **argv, struct prepare_opts *o, char **trained)
{
    int code = read_command_line(argc, argv, o);
    if (code != GO_ON)
        return code;
    if (!o->format)
        guess_format(o);
    if ((code = images_or_go_on(o)) != GO_ON || (code = check_tokenizer_flags(o, trained)) != GO_ON)
        return code;
    int rc;
    if (strcmp(o->format, "csv") == 0)
        rc = tr_prepare_csv(o);
    else if (strcmp(o->format, "instruct") == 0) /* never guessed from the inputs */
        rc = tr_prepare_instruct(o);
    else
        rc = tr_prepare_text(o);
    return rc == 0 ? TR_EXIT_OK : TR_EXIT_ERROR;
}

int tr_prepare_main(int argc, char **argv)
{
    struct prepare_opts o = {
        .tokenizer = "byte",
        .shard_tokens = 100000000,
        .val_fraction = 0.05,
        .dedup = "exact",
        .near_threshold = 0.8,
        .doc_separator = "blank-line",
        .text_field = "text",
        .channels = 3,
        .augment_pad = -1,
    };
    o.inputs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *o.inputs);
    o.val_inputs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *o.val_inputs);
    if (!o.inputs || !o.val_inputs) {
        free(o.val_inputs);
        tr_prepare_fail("out of memory");
        return TR_EXIT_ERROR;
    }
    char *trained = NULL;
    int code = prepare(argc, argv, &o, &trained);
    free(trained);
    free(o.inputs);
    free(o.val_inputs);
    return code;
}
