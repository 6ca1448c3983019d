/* fsdp-launch's --help and --print-config, and the FSDP_LAUNCH_CONFIG text the workers receive. */
#include "launcher/args_internal.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

void launch_args_usage(FILE *f)
{
    fprintf(f, "usage: fsdp-launch [FLAGS] [--] PROGRAM [ARGS...]\n"
               "       fsdp-launch config [--config_file PATH] [--ini PATH]   (questions, then an accelerate YAML)\n"
               "Starts nproc_per_node copies of PROGRAM on this node with torchrun's environment. A .py PROGRAM\n"
               "(or one that is not executable) runs as PYTHON -u PROGRAM, as under torchrun.\n"
               "Flags (also --flag-name spelling, --flag=value, and PET_<FLAG_NAME> variables):\n");
    for (int i = 0; i < O_COUNT; i++) {
        char names[96];
        int n = snprintf(names, sizeof names, "--%s", launch_opts[i].name);
        for (int k = 0; k < 3 && launch_opts[i].aliases[k]; k++)
            n += snprintf(names + n, sizeof names - (size_t)n, ", %s%s", strlen(launch_opts[i].aliases[k]) == 1 ? "-" : "--",
                          launch_opts[i].aliases[k]);
        fprintf(f, "  %-34s %s\n", names, launch_opts[i].help);
    }
    fprintf(f, "  %-34s %s\n", "--use_fsdp, --fsdp_enable, --fsdp_*", "fsdp-worker settings (accelerate's flags)");
    fprintf(f, "  %-34s %s\n", "--mixed_precision, --cpu", "fsdp-worker settings (fsdp.mixed_precision, train.device)");
}

char *launch_args_settings_json(const struct launch_args *a)
{
    if (!a->n_settings)
        return NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *under = cJSON_AddArrayToObject(root, "under_file");
    cJSON *over = cJSON_AddArrayToObject(root, "over_file");
    for (int i = 0; i < a->n_settings; i++) {
        const struct launch_setting *s = &a->settings[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "key", s->key);
        cJSON_AddStringToObject(e, "value", s->value);
        cJSON_AddStringToObject(e, "origin", s->origin);
        cJSON_AddItemToArray(s->over_file ? over : under, e);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static const char *mode_name(enum launch_mode m)
{
    switch (m) {
    case LAUNCH_NO_PYTHON: return "no_python";
    case LAUNCH_MODULE: return "module";
    case LAUNCH_RUN_PATH: return "run_path";
    default: return "auto";
    }
}

/* The effective value of each launch setting that has one (flags that only select behaviour have none). */
static bool effective(const struct launch_args *a, int id, char *buf, size_t cap)
{
    switch (id) {
    case O_NNODES: snprintf(buf, cap, "%d", a->nnodes); return true;
    case O_NODE_RANK: snprintf(buf, cap, "%d", a->node_rank); return true;
    case O_NPROC: snprintf(buf, cap, "%d", a->nproc_per_node); return true;
    case O_MASTER_ADDR: snprintf(buf, cap, "%s", a->master_addr); return true;
    case O_MASTER_PORT: snprintf(buf, cap, "%d", a->master_port); return true;
    case O_STANDALONE: snprintf(buf, cap, "%s", a->standalone ? "true" : "false"); return true;
    case O_MAX_RESTARTS: snprintf(buf, cap, "%d", a->max_restarts); return true;
    case O_MONITOR: snprintf(buf, cap, "%g", a->monitor_interval_s); return true;
    case O_RDZV_ID: snprintf(buf, cap, "%s", a->run_id); return true;
    case O_RDZV_TIMEOUT: snprintf(buf, cap, "%g", a->rdzv_timeout_s); return true;
    case O_LOG_MAX_BYTES: snprintf(buf, cap, "%lld", a->log_max_bytes); return true;
    case O_LOG_DIR: snprintf(buf, cap, "%s", a->log_dir); return true;
    case O_STATUS_PORT:
        if (a->status_port < 0)
            snprintf(buf, cap, "off");
        else
            snprintf(buf, cap, "%d", a->status_port);
        return true;
    case O_STATUS_ADDR: snprintf(buf, cap, "%s", a->status_addr); return true;
    case O_STATUS_STALE: snprintf(buf, cap, "%g", a->status_stale_s); return true;
    case O_REDIRECTS: snprintf(buf, cap, "%s", a->redirects[0] ? a->redirects : "0"); return true;
    case O_TEE: snprintf(buf, cap, "%s", a->tee[0] ? a->tee : "0"); return true;
    case O_FILTER: snprintf(buf, cap, "%s", a->local_ranks_filter); return true;
    case O_PREFIX_TEMPLATE: snprintf(buf, cap, "%s", a->prefix_template); return true;
    case O_ROLE: snprintf(buf, cap, "%s", a->role); return true;
    case O_SHUTDOWN: snprintf(buf, cap, "%g", a->shutdown_timeout_s); return true;
    case O_LOG_LEVEL: {
        static const char *const names[] = {"debug", "info", "warn", "error", "off"};
        snprintf(buf, cap, "%s", a->log_level >= LOG_DEBUG && a->log_level <= LOG_OFF ? names[a->log_level] : "info");
        return true;
    }
    case O_LOCAL_ADDR: snprintf(buf, cap, "%s", a->local_addr); return true;
    case O_PYTHON: snprintf(buf, cap, "%s", a->python); return true;
    case O_GPU_IDS: snprintf(buf, cap, "%s", a->gpu_ids[0] ? a->gpu_ids : "all"); return true;
    case O_OMP_THREADS: snprintf(buf, cap, "%d", a->omp_threads); return true;
    case O_VIRTUAL_LOCAL_RANK: snprintf(buf, cap, "%s", a->virtual_local_rank ? "true" : "false"); return true;
    case O_NO_TORCH_STORE: snprintf(buf, cap, "%s", a->no_torch_store ? "true" : "false"); return true;
    case O_CONFIG_FILE: snprintf(buf, cap, "%s", a->config_file); return true;
    case O_SIGNALS: {
        size_t n = 0;
        buf[0] = 0;
        for (int i = 0; i < a->n_signals && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%sSIG%s", i ? "," : "", sigabbrev_np(a->signals[i]));
        return true;
    }
    default: return false;
    }
}

int launch_args_print(const struct launch_args *a, FILE *f, bool json)
{
    char value[1100];
    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON *launch = cJSON_AddObjectToObject(root, "launch");
        for (int id = 0; id < O_COUNT; id++) {
            if (!effective(a, id, value, sizeof value))
                continue;
            cJSON *e = cJSON_AddObjectToObject(launch, launch_opts[id].name);
            cJSON_AddStringToObject(e, "value", value);
            cJSON_AddStringToObject(e, "origin", a->origins[id].origin[0] ? a->origins[id].origin : "default");
        }
        cJSON_AddStringToObject(launch, "mode", mode_name(a->mode));
        cJSON *w = cJSON_AddArrayToObject(root, "worker");
        for (int i = 0; i < a->n_settings; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "key", a->settings[i].key);
            cJSON_AddStringToObject(e, "value", a->settings[i].value);
            cJSON_AddStringToObject(e, "origin", a->settings[i].origin);
            cJSON_AddStringToObject(e, "layer", a->settings[i].over_file ? "over_file" : "under_file");
            cJSON_AddItemToArray(w, e);
        }
        cJSON *ig = cJSON_AddArrayToObject(root, "ignored");
        for (int i = 0; i < a->n_ignored; i++)
            cJSON_AddItemToArray(ig, cJSON_CreateString(a->ignored[i]));
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        if (!text)
            return error_set(FSDP_ENOMEM, "out of memory");
        fprintf(f, "%s\n", text);
        free(text);
    } else {
        fprintf(f, "# fsdp-launch: effective settings ('# origin'; no origin = default)\n");
        for (int id = 0; id < O_COUNT; id++) {
            if (!effective(a, id, value, sizeof value))
                continue;
            char line[1300];
            snprintf(line, sizeof line, "%s = %s", launch_opts[id].name, value);
            if (a->origins[id].origin[0])
                fprintf(f, "%-40s # %s\n", line, a->origins[id].origin);
            else
                fprintf(f, "%s\n", line);
        }
        fprintf(f, "mode = %s\n", mode_name(a->mode));
        if (a->n_settings) {
            fprintf(f, "\n# fsdp-worker settings (FSDP_LAUNCH_CONFIG): YAML under the worker's INI file, "
                       "fsdp-launch's flags over it\n");
            for (int i = 0; i < a->n_settings; i++) {
                char line[600];
                snprintf(line, sizeof line, "%s = %s", a->settings[i].key, a->settings[i].value);
                fprintf(f, "%-40s # %s, %s the INI file\n", line, a->settings[i].origin,
                        a->settings[i].over_file ? "over" : "under");
            }
        }
        if (a->n_ignored) {
            fprintf(f, "\n# ignored (no meaning for fsdpc):\n");
            for (int i = 0; i < a->n_ignored; i++)
                fprintf(f, "#   %s\n", a->ignored[i]);
        }
    }
    if (fflush(f) != 0 || ferror(f))
        return error_set(FSDP_EIO, "cannot write the settings");
    return 0;
}
