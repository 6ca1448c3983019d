/* fsdp-launch config: accelerate config's questions on stdin, an accelerate YAML (libyaml's emitter) or an
 * INI of fsdp-worker settings out. */
#include "launcher/wizard.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "launcher/command.h"

#define ANSWER_MAX 512

/* One `key: value` of the YAML; fsdp keys go under fsdp_config. */
struct kv {
    char key[64];
    char value[ANSWER_MAX];
    bool fsdp;
    bool quoted; /* a string that must stay a string (an address, a class list) */
};

/* The questions of accelerate config that fsdp-launch config asks (the table `questions` below). */
enum q_id {
    Q_MACHINE, Q_NUM_MACHINES, Q_MACHINE_RANK, Q_MAIN_IP, Q_MAIN_PORT, Q_NUM_PROCESSES, Q_FSDP, Q_VERSION,
    Q_STRATEGY, Q_RESHARD, Q_OFFLOAD, Q_WRAP, Q_BLOCKS_INI, Q_CLASSES, Q_MIN_PARAMS, Q_BACKWARD_PREFETCH,
    Q_STATE_DICT, Q_FORWARD_PREFETCH, Q_ORIG_PARAMS, Q_RAM_EFFICIENT, Q_SYNC_STATES, Q_ACTIVATION_CKPT,
    Q_MIXED_PRECISION, Q_COUNT
};

enum q_kind { Q_OPTIONS, Q_YES_NO, Q_INT, Q_TEXT };

/* n: the option's index, 1/0 for yes/no, the integer; text: the answer as the YAML writes it. */
struct answer {
    long n;
    char text[ANSWER_MAX];
};

struct wizard {
    bool tty;
    struct kv kv[48];
    int n;
    struct answer ans[Q_COUNT];
};

/* One question. Later questions depend on earlier answers only through `when`, `ask`, `hi_of` and `suggest`. */
struct question {
    enum q_kind kind;
    const char *prompt;          /* Q_OPTIONS: the line above the menu; with `suggest`, "%s" is Enter's answer */
    const char *const *options;  /* Q_OPTIONS */
    int n_options;
    long def;                    /* Enter's answer: the option's index, 1/0 for yes/no, the integer */
    long lo, hi;                 /* Q_INT: what is allowed */
    long unasked;                /* the answer when `ask` says no (or `when` does: then only for later questions) */
    const char *def_text;        /* Q_TEXT: Enter's answer (NULL: an answer is required) */
    const char *key;             /* the YAML key the answer sets (fsdp_ keys go under fsdp_config); NULL: none */
    bool quoted;                 /* a string that must stay a string */
    bool (*when)(const struct wizard *w); /* the question and its key exist (NULL: always) */
    bool (*ask)(const struct wizard *w);  /* the question is asked (NULL: always); else its key is `unasked` */
    long (*hi_of)(const struct wizard *w); /* Q_INT: the upper bound, from earlier answers */
    void (*suggest)(const struct wizard *w, char *def, size_t cap); /* Q_TEXT: Enter's answer, from earlier ones */
    int (*check)(const struct wizard *w); /* refuses an answer that does not fit earlier ones */
};

static void put(struct wizard *w, bool fsdp, const char *key, const char *value, bool quoted)
{
    struct kv *e = &w->kv[w->n++];
    snprintf(e->key, sizeof e->key, "%s", key);
    snprintf(e->value, sizeof e->value, "%s", value);
    e->fsdp = fsdp;
    e->quoted = quoted;
}

/* Prints the question, reads one line. Into a pipe the answer is echoed, so a transcript reads like the
 * session at a terminal. */
static int ask_line(struct wizard *w, const char *prompt, char *out, size_t cap)
{
    fputs(prompt, stdout);
    fflush(stdout);
    if (!fgets(out, (int)cap, stdin))
        return error_set(FSDP_EINVAL, "stdin ended before this question was answered: %s", prompt);
    out[strcspn(out, "\r\n")] = 0;
    if (!w->tty)
        printf("%s\n", out);
    char *s = out;
    while (*s == ' ' || *s == '\t')
        s++;
    memmove(out, s, strlen(s) + 1);
    size_t n = strlen(out);
    while (n && (out[n - 1] == ' ' || out[n - 1] == '\t'))
        out[--n] = 0;
    return 0;
}

/* A numbered menu: the answer is the number or the option's text; empty = the default. */
static int ask_options(struct wizard *w, const char *question, const char *const *options, int n, int def, int *out)
{
    *out = def;
    for (int tries = 0; tries < 20; tries++) {
        printf("%s\n", question);
        for (int i = 0; i < n; i++)
            printf("  [%d] %s%s\n", i, options[i], i == def ? " (default)" : "");
        char prompt[64], line[ANSWER_MAX];
        snprintf(prompt, sizeof prompt, "Please select a choice [%d]: ", def);
        int rc = ask_line(w, prompt, line, sizeof line);
        if (rc)
            return rc;
        if (!line[0]) {
            *out = def;
            return 0;
        }
        char *end;
        long v = strtol(line, &end, 10);
        if (!*end && v >= 0 && v < n) {
            *out = (int)v;
            return 0;
        }
        for (int i = 0; i < n; i++)
            if (strcasecmp(line, options[i]) == 0) {
                *out = i;
                return 0;
            }
        printf("Please enter a number from 0 to %d or one of the choices.\n", n - 1);
    }
    return error_set(FSDP_EINVAL, "no valid answer to: %s", question);
}

static int ask_yes_no(struct wizard *w, const char *question, bool def, bool *out)
{
    *out = def;
    for (int tries = 0; tries < 20; tries++) {
        char line[ANSWER_MAX];
        int rc = ask_line(w, question, line, sizeof line);
        if (rc)
            return rc;
        if (!line[0]) {
            *out = def;
            return 0;
        }
        if (!strcasecmp(line, "yes") || !strcasecmp(line, "y")) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(line, "no") || !strcasecmp(line, "n")) {
            *out = false;
            return 0;
        }
        printf("Please enter yes or no.\n");
    }
    return error_set(FSDP_EINVAL, "no valid answer to: %s", question);
}

static int ask_int(struct wizard *w, const char *question, long def, long lo, long hi, long *out)
{
    *out = def;
    for (int tries = 0; tries < 20; tries++) {
        char line[ANSWER_MAX];
        int rc = ask_line(w, question, line, sizeof line);
        if (rc)
            return rc;
        if (!line[0] && def >= lo) {
            *out = def;
            return 0;
        }
        char *end;
        errno = 0;
        double v = strtod(line, &end); /* accelerate shows 1e8 as a default */
        if (line[0] && !*end && !errno && v >= (double)lo && v <= (double)hi && v == (double)(long)v) {
            *out = (long)v;
            return 0;
        }
        printf("Please enter an integer from %ld to %ld.\n", lo, hi);
    }
    return error_set(FSDP_EINVAL, "no valid answer to: %s", question);
}

static int ask_text(struct wizard *w, const char *question, const char *def, char *out, size_t cap)
{
    for (int tries = 0; tries < 20; tries++) {
        int rc = ask_line(w, question, out, cap);
        if (rc)
            return rc;
        if (!out[0] && def)
            snprintf(out, cap, "%s", def);
        if (out[0])
            return 0;
        printf("Please enter a value.\n");
    }
    return error_set(FSDP_EINVAL, "no valid answer to: %s", question);
}

/* Runs `fsdp-worker --detect-blocks INI` twice: once for the user to read the table, once as JSON for the
 * suggestion. Returns the suggested transformer_layer_cls_to_wrap in out ("" when detection failed). */
static void detect_blocks(const char *ini, char *out, size_t cap)
{
    out[0] = 0;
    char worker[FSDP_PATH_MAX];
    if (command_find_program("fsdp-worker", worker, sizeof worker) != 0) {
        printf("(fsdp-worker not found: %s)\n", error_message());
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(worker, worker, "--detect-blocks", ini, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("(block detection failed; see the message above)\n");
        return;
    }
    int fds[2];
    if (pipe(fds) != 0)
        return;
    pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(worker, worker, "--detect-blocks", ini, "--json", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char *json = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&json, &len);
    char buf[4096];
    ssize_t r;
    while (mem && (r = read(fds[0], buf, sizeof buf)) > 0)
        fwrite(buf, 1, (size_t)r, mem);
    close(fds[0]);
    if (mem)
        fclose(mem);
    if (pid > 0)
        waitpid(pid, &st, 0);
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "suggested_transformer_layer_cls_to_wrap");
    if (cJSON_IsString(s))
        snprintf(out, cap, "%s", s->valuestring);
    cJSON_Delete(root);
    free(json);
}

/* ---- the questions ------------------------------------------------------------------------------- */

static bool distributed(const struct wizard *w) { return w->ans[Q_MACHINE].n > 0; }
static bool multi_node(const struct wizard *w) { return w->ans[Q_NUM_MACHINES].n > 1; }
static bool fsdp(const struct wizard *w) { return w->ans[Q_FSDP].n != 0; }
static bool fsdp1(const struct wizard *w) { return fsdp(w) && w->ans[Q_VERSION].n == 0; }
static bool fsdp2(const struct wizard *w) { return fsdp(w) && w->ans[Q_VERSION].n == 1; }
static bool wrap_blocks(const struct wizard *w) { return fsdp(w) && w->ans[Q_WRAP].n == 0; }
static bool wrap_size(const struct wizard *w) { return fsdp(w) && w->ans[Q_WRAP].n == 1; }
static bool ram_inefficient(const struct wizard *w) { return w->ans[Q_RAM_EFFICIENT].n == 0; }
static long last_machine(const struct wizard *w) { return w->ans[Q_NUM_MACHINES].n - 1; }

static int processes_split_evenly(const struct wizard *w)
{
    long np = w->ans[Q_NUM_PROCESSES].n, nm = w->ans[Q_NUM_MACHINES].n;
    if (np % nm == 0)
        return 0;
    printf("%ld processes cannot be split evenly over %ld machines; every machine runs the same number.\n", np, nm);
    return error_set(FSDP_EINVAL, "num_processes %ld is not a multiple of num_machines %ld", np, nm);
}

/* The classes to wrap default to what --detect-blocks suggests for the INI the previous answer named. */
static void suggest_classes(const struct wizard *w, char *def, size_t cap)
{
    const char *ini = w->ans[Q_BLOCKS_INI].text;
    def[0] = 0;
    if (strcasecmp(ini, "none") != 0)
        detect_blocks(ini, def, cap);
    if (!def[0])
        snprintf(def, cap, "DecoderBlock");
}

static const char *const machines[] = {"No distributed training", "multi-CPU", "multi-GPU"};
static const char *const versions[] = {"1", "2"};
static const char *const strategies[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                         "HYBRID_SHARD_ZERO2"};
static const char *const wraps[] = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"};
static const char *const backward_prefetch[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
static const char *const state_dicts[] = {"SHARDED_STATE_DICT", "FULL_STATE_DICT"};
static const char *const precisions[] = {"no", "fp16", "bf16"};
#define OPTIONS(o) .options = o, .n_options = (int)(sizeof o / sizeof o[0])

/* accelerate config's questions in its order, each with the YAML key its answer sets (the fsdp_ keys in the
 * order accelerate writes them: fsdp-worker's INI lists them so). */
static const struct question questions[Q_COUNT] = {
    [Q_MACHINE] = {Q_OPTIONS, "Which type of machine are you using?", OPTIONS(machines)},
    [Q_NUM_MACHINES] = {Q_INT, "How many different machines will you use (use more than 1 for multi-node "
                               "training)? [1]: ", .def = 1, .lo = 1, .hi = 1 << 20, .unasked = 1,
                        .key = "num_machines", .ask = distributed},
    [Q_MACHINE_RANK] = {Q_INT, "What is the rank of this machine? [0]: ", .def = 0, .lo = 0, .hi_of = last_machine,
                        .key = "machine_rank", .ask = multi_node},
    [Q_MAIN_IP] = {Q_TEXT, "What is the IP address of the machine that will host the main process? ",
                   .key = "main_process_ip", .quoted = true, .when = multi_node},
    [Q_MAIN_PORT] = {Q_INT, "What is the port you will use to communicate with the main process? [29500]: ",
                     .def = 29500, .lo = 1, .hi = 65535, .key = "main_process_port", .when = multi_node},
    [Q_NUM_PROCESSES] = {Q_INT, "How many processes should be used for distributed training, over all machines? "
                                "[1]: ", .def = 1, .lo = 1, .hi = 1 << 24, .unasked = 1, .key = "num_processes",
                         .ask = distributed, .check = processes_split_evenly},
    [Q_FSDP] = {Q_YES_NO, "Do you want to use FullyShardedDataParallel? [YES/no]: ", .def = 1, .when = distributed},
    [Q_VERSION] = {Q_OPTIONS, "What should be your FSDP version?", OPTIONS(versions), .def = 1,
                   .key = "fsdp_version", .when = fsdp},
    [Q_STRATEGY] = {Q_OPTIONS, "What should be your sharding strategy?", OPTIONS(strategies),
                    .key = "fsdp_reshard_after_forward", .when = fsdp1},
    [Q_RESHARD] = {Q_YES_NO, "Do you want to enable resharding after forward? [YES/no]: ", .def = 1,
                   .key = "fsdp_reshard_after_forward", .when = fsdp2},
    [Q_OFFLOAD] = {Q_YES_NO, "Do you want to offload parameters and gradients to CPU? [yes/NO]: ",
                   .key = "fsdp_offload_params", .when = fsdp},
    [Q_WRAP] = {Q_OPTIONS, "What should be your auto wrap policy?", OPTIONS(wraps), .key = "fsdp_auto_wrap_policy",
                .when = fsdp},
    [Q_BLOCKS_INI] = {Q_TEXT, "fsdp-worker config (INI) of the model, to detect its blocks [none]: ",
                      .def_text = "none", .when = wrap_blocks},
    [Q_CLASSES] = {Q_TEXT, "Specify the comma-separated list of transformer layer class names (case-sensitive) "
                           "to wrap [%s]: ", .suggest = suggest_classes,
                   .key = "fsdp_transformer_layer_cls_to_wrap", .quoted = true, .when = wrap_blocks},
    [Q_MIN_PARAMS] = {Q_INT, "What should be your FSDP's minimum number of parameters for Default Auto Wrapping "
                             "Policy? [1e8]: ", .def = 100000000, .lo = 0, .hi = 1L << 50,
                      .key = "fsdp_min_num_params", .when = wrap_size},
    [Q_BACKWARD_PREFETCH] = {Q_OPTIONS, "What should be your FSDP's backward prefetch policy?",
                             OPTIONS(backward_prefetch), .key = "fsdp_backward_prefetch", .when = fsdp1},
    [Q_STATE_DICT] = {Q_OPTIONS, "What should be your FSDP's state dict type?", OPTIONS(state_dicts),
                      .key = "fsdp_state_dict_type", .when = fsdp},
    [Q_FORWARD_PREFETCH] = {Q_YES_NO, "Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ",
                            .key = "fsdp_forward_prefetch", .when = fsdp1},
    [Q_ORIG_PARAMS] = {Q_YES_NO, "Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ", .def = 1,
                       .key = "fsdp_use_orig_params", .when = fsdp1},
    [Q_RAM_EFFICIENT] = {Q_YES_NO, "Do you want to enable CPU RAM efficient model loading? [YES/no]: ", .def = 1,
                         .key = "fsdp_cpu_ram_efficient_loading", .when = fsdp},
    /* Loading efficiently implies the broadcast, so it is asked only without. */
    [Q_SYNC_STATES] = {Q_YES_NO, "Do you want each individually wrapped FSDP unit to broadcast module parameters "
                                 "from rank 0 at the start? [YES/no]: ", .def = 1, .unasked = 1,
                       .key = "fsdp_sync_module_states", .when = fsdp1, .ask = ram_inefficient},
    [Q_ACTIVATION_CKPT] = {Q_YES_NO, "Do you want to enable FSDP activation checkpointing? [yes/NO]: ",
                           .key = "fsdp_activation_checkpointing", .when = fsdp},
    [Q_MIXED_PRECISION] = {Q_OPTIONS, "Do you wish to use mixed precision?", OPTIONS(precisions),
                           .key = "mixed_precision"},
};

/* The answer's text as the YAML has it. */
static void answer_text(const struct question *q, struct answer *a)
{
    if (q->kind == Q_OPTIONS)
        snprintf(a->text, sizeof a->text, "%s", q->options[a->n]);
    else if (q->kind == Q_YES_NO)
        snprintf(a->text, sizeof a->text, "%s", a->n ? "true" : "false");
    else if (q->kind == Q_INT)
        snprintf(a->text, sizeof a->text, "%ld", a->n);
}

static int ask(struct wizard *w, const struct question *q, struct answer *a)
{
    switch (q->kind) {
    case Q_OPTIONS: {
        int v;
        FSDP_TRY(ask_options(w, q->prompt, q->options, q->n_options, (int)q->def, &v));
        a->n = v;
        return 0;
    }
    case Q_YES_NO: {
        bool b;
        FSDP_TRY(ask_yes_no(w, q->prompt, q->def != 0, &b));
        a->n = b;
        return 0;
    }
    case Q_INT: return ask_int(w, q->prompt, q->def, q->lo, q->hi_of ? q->hi_of(w) : q->hi, &a->n);
    case Q_TEXT:
        if (q->suggest) {
            char def[ANSWER_MAX], prompt[ANSWER_MAX + 200];
            q->suggest(w, def, sizeof def);
            snprintf(prompt, sizeof prompt, q->prompt, def);
            return ask_text(w, prompt, def, a->text, sizeof a->text);
        }
        return ask_text(w, q->prompt, q->def_text, a->text, sizeof a->text);
    }
    return 0;
}

/* The keys no single answer sets. */
static void put_derived(struct wizard *w)
{
    long kind = w->ans[Q_MACHINE].n;
    put(w, false, "compute_environment", "LOCAL_MACHINE", false);
    put(w, false, "distributed_type", fsdp(w) ? "FSDP" : kind == 0 ? "NO" : kind == 1 ? "MULTI_CPU" : "MULTI_GPU",
        false);
    put(w, false, "rdzv_backend", "static", false);
    put(w, false, "same_network", "true", false);
    put(w, false, "use_cpu", kind == 1 ? "true" : "false", false);
    put(w, false, "debug", "false", false);
}

static int ask_all(struct wizard *w)
{
    for (int i = 0; i < Q_COUNT; i++) {
        w->ans[i].n = questions[i].unasked;
        answer_text(&questions[i], &w->ans[i]);
    }
    for (int i = 0; i < Q_COUNT; i++) {
        const struct question *q = &questions[i];
        struct answer *a = &w->ans[i];
        if (q->when && !q->when(w))
            continue;
        if (!q->ask || q->ask(w)) {
            FSDP_TRY(ask(w, q, a));
            answer_text(q, a);
        }
        if (q->check)
            FSDP_TRY(q->check(w));
        if (q->key)
            put(w, strncmp(q->key, "fsdp_", 5) == 0, q->key, a->text, q->quoted);
    }
    put_derived(w);
    return 0;
}

static int emit(yaml_emitter_t *e, yaml_event_t *ev) { return yaml_emitter_emit(e, ev) ? 0 : -1; }

static int emit_scalar(yaml_emitter_t *e, const char *s, bool quoted)
{
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1,
                                 quoted ? YAML_SINGLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE);
    return emit(e, &ev);
}

static int cmp_kv(const void *x, const void *y)
{
    return strcmp(((const struct kv *)x)->key, ((const struct kv *)y)->key);
}

/* accelerate writes its keys sorted (yaml.safe_dump); so does this. */
static int write_yaml(struct wizard *w, const char *path)
{
    qsort(w->kv, (size_t)w->n, sizeof w->kv[0], cmp_kv);
    FILE *f = fopen(path, "w");
    if (!f)
        return error_set(FSDP_EIO, "cannot write %s: %s", path, strerror(errno));
    yaml_emitter_t e;
    yaml_event_t ev;
    yaml_emitter_initialize(&e);
    yaml_emitter_set_output_file(&e, f);
    yaml_emitter_set_unicode(&e, 1);
    int bad = 0;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    bad |= emit(&e, &ev);
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    bad |= emit(&e, &ev);
    yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
    bad |= emit(&e, &ev);
    bool fsdp_done = false;
    for (int i = 0; i < w->n && !bad; i++) {
        if (w->kv[i].fsdp)
            continue;
        if (!fsdp_done && strcmp(w->kv[i].key, "fsdp_config") > 0) {
            fsdp_done = true;
            bad |= emit_scalar(&e, "fsdp_config", false);
            yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
            bad |= emit(&e, &ev);
            for (int k = 0; k < w->n; k++)
                if (w->kv[k].fsdp) {
                    bad |= emit_scalar(&e, w->kv[k].key, false);
                    bad |= emit_scalar(&e, w->kv[k].value, w->kv[k].quoted);
                }
            yaml_mapping_end_event_initialize(&ev);
            bad |= emit(&e, &ev);
        }
        bad |= emit_scalar(&e, w->kv[i].key, false);
        bad |= emit_scalar(&e, w->kv[i].value, w->kv[i].quoted);
    }
    yaml_mapping_end_event_initialize(&ev);
    bad |= emit(&e, &ev);
    yaml_document_end_event_initialize(&ev, 1);
    bad |= emit(&e, &ev);
    yaml_stream_end_event_initialize(&ev);
    bad |= emit(&e, &ev);
    const char *problem = e.problem;
    yaml_emitter_delete(&e);
    if (fclose(f) != 0 || bad)
        return error_set(FSDP_EIO, "cannot write %s: %s", path, bad && problem ? problem : strerror(errno));
    return 0;
}

/* The same answers as fsdp-worker settings (docs/config.md names), with the launch as a comment. */
static int write_ini(const struct wizard *w, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return error_set(FSDP_EIO, "cannot write %s: %s", path, strerror(errno));
    const char *get[8] = {0};
    static const char *const names[] = {"num_machines", "machine_rank", "num_processes", "main_process_ip",
                                        "main_process_port", "distributed_type", "use_cpu", "mixed_precision"};
    for (int i = 0; i < w->n; i++)
        for (int k = 0; k < 8; k++)
            if (!w->kv[i].fsdp && strcmp(w->kv[i].key, names[k]) == 0)
                get[k] = w->kv[i].value;
    long nm = get[0] ? atol(get[0]) : 1, np = get[2] ? atol(get[2]) : 1;
    fprintf(f, "# fsdp-worker settings written by fsdp-launch config. Launch with:\n#   fsdp-launch --nnodes %ld "
               "--node_rank %s --nproc_per_node %ld", nm, get[1] ? get[1] : "0", np / (nm > 0 ? nm : 1));
    if (get[3])
        fprintf(f, " --master_addr %s --master_port %s", get[3], get[4] ? get[4] : "29500");
    fprintf(f, " fsdp-worker %s\n", path);
    fprintf(f, "\n[train]\ndevice = %s\n", get[6] && !strcmp(get[6], "true") ? "cpu" : "auto");
    fprintf(f, "\n[fsdp]\nenable = %s\n", get[5] && !strcmp(get[5], "FSDP") ? "true" : "false");
    if (get[7])
        fprintf(f, "mixed_precision = %s\n", !strcmp(get[7], "no") ? "fp32" : get[7]);
    /* accelerate's fsdp_X is fsdp-worker's [fsdp] X, except where the section differs. */
    for (int i = 0; i < w->n; i++) {
        if (!w->kv[i].fsdp)
            continue;
        const char *k = w->kv[i].key + 5, *v = w->kv[i].value;
        if (!strcmp(k, "state_dict_type") || !strcmp(k, "cpu_ram_efficient_loading"))
            continue;
        if (!strcmp(k, "activation_checkpointing"))
            continue;
        if (!strcmp(k, "reshard_after_forward") && strcmp(v, "true") && strcmp(v, "false"))
            fprintf(f, "sharding_strategy = %s\n", v);
        else
            fprintf(f, "%s = %s\n", k, v);
    }
    for (int i = 0; i < w->n; i++) {
        if (!w->kv[i].fsdp)
            continue;
        const char *k = w->kv[i].key + 5;
        if (!strcmp(k, "activation_checkpointing"))
            fprintf(f, "\n[model]\nactivation_checkpointing = %s\n", w->kv[i].value);
    }
    fprintf(f, "\n[checkpoint]\n");
    for (int i = 0; i < w->n; i++) {
        const char *k = w->kv[i].key + 5;
        if (w->kv[i].fsdp && (!strcmp(k, "state_dict_type") || !strcmp(k, "cpu_ram_efficient_loading")))
            fprintf(f, "%s = %s\n", k, w->kv[i].value);
    }
    if (fclose(f) != 0)
        return error_set(FSDP_EIO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

int wizard_main(int argc, char **argv)
{
    const char *yaml_path = NULL, *ini_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        const char *v = NULL;
        if (!strncmp(a, "--config_file", 13) || !strncmp(a, "--config-file", 13))
            dst = &yaml_path, v = a[13] == '=' ? a + 14 : a[13] ? NULL : (i + 1 < argc ? argv[++i] : NULL);
        else if (!strncmp(a, "--ini", 5))
            dst = &ini_path, v = a[5] == '=' ? a + 6 : a[5] ? NULL : (i + 1 < argc ? argv[++i] : NULL);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: fsdp-launch config [--config_file PATH.yaml] [--ini PATH.ini]\n"
                   "Asks accelerate config's questions on stdin and writes an accelerate config (default\n"
                   "./accelerate_config.yaml) for fsdp-launch --config_file, or with --ini the fsdp-worker settings.\n");
            return 0;
        }
        if (!dst || !v || !*v) {
            log_error("fsdp-launch config: unexpected '%s'; usage: fsdp-launch config [--config_file PATH] [--ini PATH]",
                      a);
            return 2;
        }
        *dst = v;
    }
    if (!yaml_path && !ini_path)
        yaml_path = "accelerate_config.yaml";
    struct wizard w = {.tty = isatty(0) == 1};
    printf("-----------------------------------------------------------------------------------------------\n"
           "fsdp-launch config: the questions of accelerate config. Press Enter for the default in brackets.\n"
           "-----------------------------------------------------------------------------------------------\n");
    int rc = ask_all(&w);
    if (rc) {
        printf("\n");
        log_error("fsdp-launch config: %s", error_message());
        return 2;
    }
    if (yaml_path && (rc = write_yaml(&w, yaml_path))) {
        log_error("%s", error_message());
        return 1;
    }
    if (ini_path && (rc = write_ini(&w, ini_path))) {
        log_error("%s", error_message());
        return 1;
    }
    if (yaml_path)
        printf("accelerate configuration saved at %s (use: fsdp-launch --config_file %s PROGRAM ...)\n", yaml_path,
               yaml_path);
    if (ini_path)
        printf("fsdp-worker settings saved at %s\n", ini_path);
    return 0;
}
