/* `fsdp-launch status DIR`: the status page of a finished or crashed run, from the files its ranks left in
 * the worker's log.dir (metrics.jsonl: the loss, val-loss and tokens/s curves; run_summary.rank<R>.json:
 * every rank's end-of-run record). Writes the HTML page (or, with --json, the /api/status object) to
 * stdout or -o FILE. docs/launcher.md. */
#ifndef FSDP_LAUNCHER_STATUS_FILES_H
#define FSDP_LAUNCHER_STATUS_FILES_H

#include <cjson/cJSON.h>

/* The snapshot (the /api/status shape, "live": false) of the run whose log.dir is dir; NULL with
 * error_message() naming the directory when it holds neither file. */
cJSON *status_files_snapshot(const char *dir);
/* argv[0] is "status"; returns the exit code. */
int status_files_main(int argc, char **argv);

#endif
