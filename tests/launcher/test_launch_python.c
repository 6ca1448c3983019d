/* PROGRAM as torchrun runs it: a .py script through the interpreter (-u), -m MODULE, --run_path,
 * --no_python, a script that is not executable; the worker environment accelerate's settings add
 * (FSDP_LAUNCH_CONFIG, --gpu_ids, --virtual_local_rank, --num_cpu_threads_per_process); an accelerate
 * YAML reaching fsdp-worker's configuration; and, with the PyPI venv, every flag of the installed torchrun
 * and the configs of the installed accelerate. tests/launcher/env_probe.py reports what a worker saw. */
#include "tests/util/launch_util.h"
#include "tests/util/tu_venv.h"

#include <cjson/cJSON.h>

#define PY "/usr/bin/python3"

static char *probe_path(void)
{
    static char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/tests/launcher/env_probe.py", getenv("FSDP_SOURCE_ROOT"));
    return p;
}

/* Runs fsdp-launch with argv[1..] (argv[0] is filled in); returns the exit code, output in dir/tag.*. */
static int launch(const char *dir, const char *tag, const char **argv, const char *const *env)
{
    argv[0] = LU_LAUNCH;
    return lu_exit_code(lu_wait(lu_spawn(argv, dir, tag, env), 60));
}

static cJSON *rank_report(const char *dir, int rank)
{
    char p[FSDP_PATH_MAX];
    snprintf(p, sizeof p, "%s/rank%d.json", dir, rank);
    char *text = tu_slurp(p);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    cr_assert_not_null(j, "rank %d wrote no report in %s", rank, dir);
    free(text);
    return j;
}

static const char *env_of(const cJSON *r, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "env"), k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const char *argv_at(const cJSON *r, int i)
{
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "argv"), i);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

Test(python, script_module_run_path_and_no_python, .timeout = 120)
{
    char *dir = lu_tmpdir();
    const char *env[] = {"PYTHON_EXEC=" PY, NULL};

    const char *script[] = {NULL, "--nproc_per_node", "2", probe_path(), dir, "a", "--b", NULL};
    cr_assert_eq(launch(dir, "script", script, env), 0, "%s", lu_slurp_tag(dir, "script", "err"));
    for (int r = 0; r < 2; r++) {
        cJSON *j = rank_report(dir, r);
        cr_expect_str_eq(argv_at(j, 0), probe_path());
        cr_expect_str_eq(argv_at(j, 2), "a");
        cr_expect_str_eq(argv_at(j, 3), "--b", "the script's own flags are its own");
        cr_expect_eq(cJSON_GetObjectItem(j, "unbuffered")->valueint, 1, "python -u, as torchrun");
        cr_expect_str_eq(cJSON_GetObjectItem(j, "executable")->valuestring, PY, "the interpreter of PYTHON_EXEC");
        cr_expect_str_eq(cJSON_GetObjectItem(j, "name")->valuestring, "__main__");
        cJSON_Delete(j);
    }

    char pypath[FSDP_PATH_MAX];
    snprintf(pypath, sizeof pypath, "PYTHONPATH=%s/tests/launcher", getenv("FSDP_SOURCE_ROOT"));
    const char *env_m[] = {"PYTHON_EXEC=" PY, pypath, NULL};
    const char *mod[] = {NULL, "--nproc_per_node", "1", "-m", "env_probe", dir, "x", NULL};
    cr_assert_eq(launch(dir, "module", mod, env_m), 0, "%s", lu_slurp_tag(dir, "module", "err"));
    cJSON *j = rank_report(dir, 0);
    cr_expect(strstr(argv_at(j, 0), "env_probe.py"), "python -m puts the module's file in argv[0]: %s", argv_at(j, 0));
    cr_expect_str_eq(argv_at(j, 2), "x");
    cr_expect_str_eq(cJSON_GetObjectItem(j, "name")->valuestring, "__main__");
    cJSON_Delete(j);

    const char *rp[] = {NULL, "--nproc_per_node", "1", "--run_path", probe_path(), dir, "y", NULL};
    cr_assert_eq(launch(dir, "run_path", rp, env), 0, "%s", lu_slurp_tag(dir, "run_path", "err"));
    j = rank_report(dir, 0);
    cr_expect_str_eq(argv_at(j, 0), probe_path(), "runpy.run_path: sys.argv = [script, args...]");
    cr_expect_str_eq(argv_at(j, 2), "y");
    cr_expect_str_eq(cJSON_GetObjectItem(j, "name")->valuestring, "__main__");
    cJSON_Delete(j);

    /* a file that is not executable and has no .py: through Python, as torchrun would */
    char noext[FSDP_PATH_MAX], text_cmd[16400];
    snprintf(noext, sizeof noext, "%s/probe_noext", dir);
    snprintf(text_cmd, sizeof text_cmd, "cp '%s' '%s' && chmod 644 '%s'", probe_path(), noext, noext);
    cr_assert_eq(tu_sh(text_cmd), 0);
    const char *ne[] = {NULL, "--nproc_per_node", "1", noext, dir, NULL};
    cr_assert_eq(launch(dir, "noext", ne, env), 0, "%s", lu_slurp_tag(dir, "noext", "err"));
    j = rank_report(dir, 0);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "executable")->valuestring, PY);
    cJSON_Delete(j);

    /* --no_python: the executable script runs as is (its #! line picks /usr/bin/python3) */
    const char *np[] = {NULL, "--nproc_per_node", "1", "--no_python", probe_path(), dir, "z", NULL};
    const char *env_bad[] = {"PYTHON_EXEC=/nonexistent/python", NULL};
    cr_assert_eq(launch(dir, "no_python", np, env_bad), 0, "%s", lu_slurp_tag(dir, "no_python", "err"));
    j = rank_report(dir, 0);
    cr_expect_str_eq(argv_at(j, 2), "z");
    cJSON_Delete(j);

    /* what cannot run says why, before anything starts */
    const char *gone[] = {NULL, "--nproc_per_node", "1", "/nonexistent/train.py", NULL};
    cr_expect_eq(launch(dir, "gone", gone, env), 2);
    char *err = lu_slurp_tag(dir, "gone", "err");
    cr_expect(strstr(err, "script '/nonexistent/train.py' does not exist (fsdp-launch runs it as " PY " -u"), "%s", err);
    free(err);
    const char *nopy[] = {NULL, "--nproc_per_node", "1", probe_path(), dir, NULL};
    cr_expect_eq(launch(dir, "nopy", nopy, env_bad), 2);
    err = lu_slurp_tag(dir, "nopy", "err");
    cr_expect(strstr(err, "the interpreter '/nonexistent/python' is not an executable file; give --python PATH"),
              "%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

Test(python, accelerate_settings_reach_the_workers, .timeout = 120)
{
    char *dir = lu_tmpdir();
    char yaml[FSDP_PATH_MAX];
    snprintf(yaml, sizeof yaml, "%s/acc.yaml", dir);
    lu_write_text(yaml, "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: FSDP\n"
                        "fsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: true\n"
                        "  fsdp_transformer_layer_cls_to_wrap: [GPT2Block]\nmixed_precision: bf16\n"
                        "num_machines: 1\nnum_processes: 2\nuse_cpu: true\ngpu_ids: 0,2\n");
    const char *env[] = {"PYTHON_EXEC=" PY, NULL};
    const char *argv[] = {NULL, "--config_file", yaml, "--virtual_local_rank", "--num_cpu_threads_per_process", "3",
                          "--fsdp_sharding_strategy", "SHARD_GRAD_OP", probe_path(), dir, NULL};
    cr_assert_eq(launch(dir, "acc", argv, env), 0, "%s", lu_slurp_tag(dir, "acc", "err"));
    const char *gpus[] = {"0", "2"};
    for (int r = 0; r < 2; r++) {
        cJSON *j = rank_report(dir, r);
        cr_expect_str_eq(env_of(j, "LOCAL_RANK"), "0", "--virtual_local_rank");
        cr_expect_str_eq(env_of(j, "CUDA_VISIBLE_DEVICES"), gpus[r], "rank %d's GPU of gpu_ids 0,2", r);
        cr_expect_str_eq(env_of(j, "OMP_NUM_THREADS"), "3");
        cJSON *lc = cJSON_Parse(env_of(j, "FSDP_LAUNCH_CONFIG") ? env_of(j, "FSDP_LAUNCH_CONFIG") : "");
        cr_assert_not_null(lc, "no FSDP_LAUNCH_CONFIG in rank %d's environment", r);
        char *flat = cJSON_PrintUnformatted(lc);
        cr_expect(strstr(flat, "{\"key\":\"fsdp.offload_params\",\"value\":\"true\",\"origin\":"), "%s", flat);
        cr_expect(strstr(flat, "\"key\":\"fsdp.transformer_layer_cls_to_wrap\",\"value\":\"GPT2Block\""), "%s", flat);
        cr_expect(strstr(flat, "\"over_file\":[{\"key\":\"fsdp.sharding_strategy\",\"value\":\"SHARD_GRAD_OP\""), "%s",
                  flat);
        free(flat);
        cJSON_Delete(lc);
        cJSON_Delete(j);
    }
    char *err = lu_slurp_tag(dir, "acc", "err");
    int listed = 0;
    for (const char *p = err; (p = strstr(p, "ignored (no meaning for fsdpc)")); p++)
        listed++;
    cr_expect_eq(listed, 1, "the ignored keys are listed once:\n%s", err);
    cr_expect(strstr(err, "debug (line 2)"), "%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}

/* fsdp-launch --config_file ... fsdp-worker CONFIG --print-config: the worker's view, with where each value
 * came from: the YAML under the INI file, fsdp-launch's flags over it, the worker's own flags last. */
Test(python, yaml_ini_command_line_precedence_in_the_worker, .timeout = 120)
{
    char *dir = lu_tmpdir();
    char yaml[FSDP_PATH_MAX], ini[FSDP_PATH_MAX];
    snprintf(yaml, sizeof yaml, "%s/acc.yaml", dir);
    snprintf(ini, sizeof ini, "%s/w.ini", dir);
    lu_write_text(yaml, "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n  fsdp_offload_params: true\n"
                        "  fsdp_backward_prefetch: BACKWARD_POST\nmixed_precision: fp16\nnum_processes: 1\n");
    lu_write_text(ini, "[fsdp]\nversion = 2\nbackward_prefetch = NO_PREFETCH\n");
    const char *argv[] = {NULL, "--config_file", yaml, "--fsdp_backward_prefetch", "BACKWARD_PRE",
                          lu_build_path("worker/fsdp-worker"), ini, "--mixed_precision=bf16", "--print-config", NULL};
    cr_assert_eq(launch(dir, "pc", argv, NULL), 0, "%s", lu_slurp_tag(dir, "pc", "err"));
    char *out = lu_slurp_tag(dir, "pc", "out");
    char want[4400];
    snprintf(want, sizeof want, "; from %s:2\nversion = 2\n", ini);
    cr_expect(strstr(out, want), "the INI beats the YAML:\n%s", out);
    snprintf(want, sizeof want, "; from %s:4 (fsdp_config.fsdp_offload_params)\noffload_params = true\n", yaml);
    cr_expect(strstr(out, want), "the YAML fills what the INI leaves:\n%s", out);
    cr_expect(strstr(out, "; from fsdp-launch --fsdp_backward_prefetch\nbackward_prefetch = BACKWARD_PRE\n"),
              "fsdp-launch's flag beats the INI:\n%s", out);
    cr_expect(strstr(out, "; from command line\nmixed_precision = bf16\n"), "the worker's own flag wins:\n%s", out);
    free(out);
    lu_rm_rf(dir);
    free(dir);
}

/* Every option of the installed torchrun (its own argparse parser) is accepted by fsdp-launch or refused
 * with a reason: none is an unknown flag. */
Test(python, every_torchrun_flag_is_known, .timeout = 120)
{
    char py[FSDP_PATH_MAX];
    if (!tu_venv_bin("python", py, sizeof py))
        cr_skip_test("no PyPI venv with torch at %s (.ci/run makes it; FSDP_TORCH_VENV names another)", py);
    char *dir = lu_tmpdir();
    const char *list[] = {py, "-c",
                          "from torch.distributed.run import get_args_parser\n"
                          "for a in get_args_parser()._actions:\n"
                          "    for s in a.option_strings:\n"
                          "        print(s, a.nargs == 0)\n",
                          NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(list, dir, "flags", NULL), 60)), 0, "%s",
                 lu_slurp_tag(dir, "flags", "err"));
    char *flags = lu_slurp_tag(dir, "flags", "out");
    /* values torchrun accepts for the flags that take one */
    static const struct {
        const char *flag, *value;
    } values[] = {{"rdzv-endpoint", "127.0.0.1:0"}, {"rdzv_endpoint", "127.0.0.1:0"}, {"rdzv-id", "x"},
                  {"rdzv_id", "x"}, {"rdzv-conf", "join_timeout=5"}, {"rdzv_conf", "join_timeout=5"},
                  {"rdzv", "static"}, {"nnodes", "1"}, {"nproc", "1"}, {"max", "1"}, {"monitor", "0.5"},
                  {"start", "spawn"}, {"event", "null"}, {"role", "r"}, {"log-dir", "/tmp"}, {"log_dir", "/tmp"},
                  {"redirects", "0"}, {"-r", "0"}, {"tee", "0"}, {"-t", "0"}, {"log-line", "[${rank}]:"},
                  {"log_line", "[${rank}]:"}, {"local-ranks", "0"}, {"local_ranks", "0"}, {"duplicate", ""},
                  {"node", "0"}, {"master-addr", "127.0.0.1"}, {"master_addr", "127.0.0.1"}, {"master", "0"},
                  {"local-addr", "127.0.0.1"}, {"local_addr", "127.0.0.1"}, {"logs", "x"}, {"numa", "node"},
                  {"signals", "SIGTERM"}, {"shutdown", "5"}, {"print", "bash"}};
    int checked = 0;
    for (char *line = strtok(flags, "\n"); line; line = strtok(NULL, "\n")) {
        char flag[128], isbool[8];
        if (sscanf(line, "%127s %7s", flag, isbool) != 2 || !strcmp(flag, "-h") || !strcmp(flag, "--help"))
            continue;
        const char *value = NULL;
        if (strcmp(isbool, "True") != 0) {
            for (size_t i = 0; i < sizeof values / sizeof values[0] && !value; i++)
                if (strncmp(flag + (flag[1] == '-' ? 2 : 0), values[i].flag, strlen(values[i].flag)) == 0 ||
                    strcmp(flag, values[i].flag) == 0)
                    value = values[i].value;
            cr_assert_not_null(value, "torchrun has a new flag %s: give the test a value for it", flag);
        }
        char arg[256];
        if (value)
            snprintf(arg, sizeof arg, "%s%s%s", flag, flag[1] == '-' ? "=" : "", value);
        else
            snprintf(arg, sizeof arg, "%s", flag);
        const char *argv[] = {NULL, arg, "--print-config=json", NULL};
        if (value && flag[1] != '-') {
            argv[1] = flag;
            argv[2] = value;
            argv[3] = "--print-config=json";
        }
        const char *full[] = {argv[0], argv[1], argv[2], argv[3], NULL};
        int code = launch(dir, "flag", full, NULL);
        char *err = lu_slurp_tag(dir, "flag", "err");
        cr_expect(code == 0 || (code == 2 && !strstr(err, "unknown flag")), "torchrun's %s: exit %d: %s", arg, code,
                  err);
        free(err);
        checked++;
    }
    cr_expect_gt(checked, 30, "only %d torchrun flags listed", checked);
    free(flags);
    lu_rm_rf(dir);
    free(dir);
}

/* The installed accelerate's own config files read as the committed fixtures do. */
Test(python, configs_written_by_accelerate_itself, .timeout = 120)
{
    char py[FSDP_PATH_MAX];
    if (!tu_venv_bin("python", py, sizeof py))
        cr_skip_test("no PyPI venv with accelerate at %s (.ci/run makes it; FSDP_TORCH_VENV names another)", py);
    char *dir = lu_tmpdir();
    char gen[FSDP_PATH_MAX];
    snprintf(gen, sizeof gen, "%s/tests/launcher/accelerate/make_configs.py", getenv("FSDP_SOURCE_ROOT"));
    const char *mk[] = {py, gen, dir, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(mk, dir, "mk", NULL), 100)), 0, "%s", lu_slurp_tag(dir, "mk", "err"));
    const char *names[] = {"fsdp2.yaml", "fsdp1.yaml", "multi_cpu.yaml", "default.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char fresh[FSDP_PATH_MAX], committed[FSDP_PATH_MAX];
        snprintf(fresh, sizeof fresh, "%s/%s", dir, names[i]);
        snprintf(committed, sizeof committed, "%s/tests/launcher/accelerate/%s", getenv("FSDP_SOURCE_ROOT"), names[i]);
        const char *a[] = {NULL, "--config_file", fresh, "--print-config=json", NULL};
        const char *b[] = {NULL, "--config_file", committed, "--print-config=json", NULL};
        cr_assert_eq(launch(dir, "fresh", a, NULL), 0, "%s: %s", names[i], lu_slurp_tag(dir, "fresh", "err"));
        cr_assert_eq(launch(dir, "committed", b, NULL), 0, "%s: %s", names[i], lu_slurp_tag(dir, "committed", "err"));
        cJSON *ja = cJSON_Parse(lu_slurp_tag(dir, "fresh", "out")), *jb = cJSON_Parse(lu_slurp_tag(dir, "committed", "out"));
        cr_assert(ja && jb);
        /* the same worker settings (keys and values; origins name different files) */
        const cJSON *wa = cJSON_GetObjectItem(ja, "worker"), *wb = cJSON_GetObjectItem(jb, "worker");
        cr_expect_eq(cJSON_GetArraySize(wa), cJSON_GetArraySize(wb), "%s", names[i]);
        for (int k = 0; k < cJSON_GetArraySize(wa) && k < cJSON_GetArraySize(wb); k++) {
            cJSON *x = cJSON_GetArrayItem(wa, k), *y = cJSON_GetArrayItem(wb, k);
            cr_expect_str_eq(cJSON_GetObjectItem(x, "key")->valuestring, cJSON_GetObjectItem(y, "key")->valuestring);
            cr_expect_str_eq(cJSON_GetObjectItem(x, "value")->valuestring, cJSON_GetObjectItem(y, "value")->valuestring,
                             "%s: %s", names[i], cJSON_GetObjectItem(x, "key")->valuestring);
        }
        cJSON_Delete(ja);
        cJSON_Delete(jb);
    }
    char ds[FSDP_PATH_MAX];
    snprintf(ds, sizeof ds, "%s/deepspeed.yaml", dir);
    const char *d[] = {NULL, "--config_file", ds, "--print-config", NULL};
    cr_expect_eq(launch(dir, "ds", d, NULL), 2);
    lu_rm_rf(dir);
    free(dir);
}

/* torchrun's --log_line_prefix_template (and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE) prefix --tee lines;
 * --duplicate_stdout_filters copies matching ones into filtered_stdout.log. */
Test(python, tee_prefix_template, .timeout = 60)
{
    char *dir = lu_tmpdir();
    const char *argv[] = {NULL, "--nproc_per_node", "2", "--tee", "1", "--role", "trainer",
                          "--log_line_prefix_template", "<${role_name}${local_rank}|${rank}> ", "--no_python",
                          "/bin/echo", "hi", NULL};
    cr_assert_eq(launch(dir, "tee", argv, NULL), 0, "%s", lu_slurp_tag(dir, "tee", "err"));
    char *out = lu_slurp_tag(dir, "tee", "out");
    cr_expect(strstr(out, "<trainer0|0> hi\n") && strstr(out, "<trainer1|1> hi\n"), "%s", out);
    free(out);
    const char *env[] = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[${rank}] ", NULL};
    const char *argv2[] = {NULL, "--nproc_per_node", "1", "--tee", "1", "--no_python", "/bin/echo", "hi", NULL};
    cr_assert_eq(launch(dir, "tee2", argv2, env), 0, "%s", lu_slurp_tag(dir, "tee2", "err"));
    out = lu_slurp_tag(dir, "tee2", "out");
    cr_expect(strstr(out, "[0] hi\n"), "%s", out);
    free(out);
    /* torchrun's --duplicate_stdout_filters: tee'd lines with a needle also go to filtered_stdout.log */
    char logs[FSDP_PATH_MAX], filtered[FSDP_PATH_MAX];
    snprintf(logs, sizeof logs, "%s/logs", dir);
    const char *dup[] = {NULL, "--nproc_per_node", "2", "--tee", "3", "--log_dir", logs, "--rdzv_id", "dup",
                         "--duplicate_stdout_filters", "loss,a,,b", "--no_python", "/bin/sh", "-c",
                         "echo \"step $RANK loss 1\"; echo quiet; echo \"a,b $RANK\"; echo \"to stderr loss\" >&2",
                         NULL};
    cr_assert_eq(launch(dir, "dup", dup, NULL), 0, "%s", lu_slurp_tag(dir, "dup", "err"));
    tu_pathf(filtered, sizeof filtered, "%s/dup/attempt_0/filtered_stdout.log", logs);
    char *f = tu_slurp(filtered);
    cr_assert_not_null(f, "no %s", filtered);
    cr_expect(strstr(f, "[rank 0]:step 0 loss 1\n") && strstr(f, "[rank 1]:step 1 loss 1\n"), "%s", f);
    cr_expect(strstr(f, "[rank 1]:a,b 1\n"), "',,' is a comma in a needle: %s", f);
    cr_expect(!strstr(f, "quiet") && !strstr(f, "stderr"), "only matching stdout lines: %s", f);
    free(f);
    const char *bad[] = {NULL, "--log_line_prefix_template", "${node}:", "--no_python", "/bin/echo", NULL};
    cr_expect_eq(launch(dir, "bad", bad, NULL), 2);
    char *err = lu_slurp_tag(dir, "bad", "err");
    cr_expect(strstr(err, "only ${role_name}, ${local_rank}, ${rank} and ${hostname} are replaced"), "%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}
