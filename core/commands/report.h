/* `trainrun report RUN_DIR`: plots of a run's metrics.jsonl as PNG images
 * (loss, throughput, learning rate, cost), an index.html that shows them,
 * and a short summary on stdout. */
#ifndef TR_REPORT_H
#define TR_REPORT_H

/* argv[0] is "report"; then RUN_DIR (or a metrics.jsonl file) and optionally
 * -o OUTDIR (default RUN_DIR/report). Returns an exit code (0, 1 error,
 * 2 usage); errors are messages on stderr. */
int tr_report_main(int argc, char **argv);

#endif
