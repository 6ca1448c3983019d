/* fsdp-ckpt's CKPT argument: a checkpoint directory, a root holding `latest`, or ROOT:latest, resolved the
 * way every subcommand needs it. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "worker/ckpt/ckpt.h"
#include "worker/tools/ckpt_tool.h"

int ckpt_tool_open(const char *target, struct ckpt_reader **out)
{
    char root[4096];
    snprintf(root, sizeof root, "%s", target);
    size_t n = strlen(root);
    if (n > 7 && strcmp(root + n - 7, ":latest") == 0) {
        root[n - 7] = '\0';
        return ckpt_open(root, CKPT_LATEST, NULL, out);
    }
    char meta[4200];
    struct stat st;
    snprintf(meta, sizeof meta, "%s/metadata.json", root);
    if (stat(meta, &st) != 0) {
        snprintf(meta, sizeof meta, "%s/%s", root, CKPT_LATEST);
        if (stat(meta, &st) == 0)
            return ckpt_open(root, CKPT_LATEST, NULL, out);
    }
    return ckpt_open(root, NULL, NULL, out);
}
