/* PROGRAM as torchrun would run it. torchrun always starts `PYTHON -u SCRIPT` unless --no_python; here a
 * program that is an executable file (fsdp-worker, a binary, a script with #!) runs as is, so both
 * `fsdp-launch train.py` and `fsdp-launch fsdp-worker cfg.ini` do what their authors mean. */
#include "launcher/command.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"

static bool is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

static bool in_path(const char *prog, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int n = snprintf(out, cap, "%.*s%s%s", (int)len, p, len ? "/" : "", prog);
        if (n > 0 && (size_t)n < cap && is_exec_file(out))
            return true;
        if (!c)
            return false;
        p = c + 1;
    }
}

int command_find_program(const char *prog, char *out, size_t cap)
{
    if (strchr(prog, '/')) {
        if (!is_exec_file(prog))
            return error_set(FSDP_ENOTFOUND, "program '%s' %s", prog,
                             access(prog, F_OK) == 0 ? "is not an executable file" : "does not exist");
        return fs_path_format(out, cap, "program", "%s", prog);
    }
    if (in_path(prog, out, cap))
        return 0;
    /* Next to fsdp-launch, so `fsdp-launch fsdp-worker cfg.ini` works from a build tree. */
    char self[FSDP_PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    self[sl > 0 ? sl : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash) {
        *slash = 0;
        /* installed: the same bin directory; a build tree: BUILD/launcher/ beside BUILD/worker/ */
        static const char *const places[] = {"%s/%s", "%s/../worker/%s"};
        for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
            int n = snprintf(out, cap, places[i], self, prog);
            if (n > 0 && (size_t)n < cap && is_exec_file(out))
                return 0;
        }
    }
    return error_set(FSDP_ENOTFOUND, "program '%s' not found in PATH nor next to fsdp-launch (%s)", prog,
                     self[0] ? self : "?");
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int find_python(const struct launch_args *a, char *out, size_t cap)
{
    const char *py = a->python;
    bool found = strchr(py, '/') ? is_exec_file(py) && snprintf(out, cap, "%s", py) > 0 : in_path(py, out, cap);
    if (!found)
        return error_set(FSDP_ENOTFOUND,
                         "%s runs through Python, but the interpreter '%s' is %s; give --python PATH (or "
                         "PYTHON_EXEC), or --no_python to run it as a program",
                         a->prog_argv[0], py, strchr(py, '/') ? "not an executable file" : "not in PATH");
    return 0;
}

/* torchrun's run_script_path: the script runs as __main__ with sys.argv = [script, args...]. */
static const char RUN_PATH_CODE[] =
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')";

int command_build(const struct launch_args *a, struct launch_command *out)
{
    memset(out, 0, sizeof *out);
    const char *prog = a->prog_argv[0];
    bool python = a->mode == LAUNCH_MODULE || a->mode == LAUNCH_RUN_PATH;
    if (a->mode == LAUNCH_AUTO) {
        char found[FSDP_PATH_MAX];
        if (ends_with(prog, ".py")) {
            python = true;
        } else if (command_find_program(prog, found, sizeof found) != 0) {
            struct stat st;
            if (stat(prog, &st) != 0 || !S_ISREG(st.st_mode))
                return FSDP_ENOTFOUND; /* the message of command_find_program stands */
            python = true; /* a script that is not executable: torchrun would give it to Python */
        }
    }
    if (!python) {
        FSDP_TRY(command_find_program(prog, out->program, sizeof out->program));
        out->argv = calloc((size_t)a->prog_argc + 1, sizeof *out->argv);
        if (!out->argv)
            return error_set(FSDP_ENOMEM, "out of memory");
        for (int i = 0; i < a->prog_argc; i++)
            out->argv[i] = a->prog_argv[i];
        return 0;
    }
    if (a->mode != LAUNCH_MODULE) {
        struct stat st;
        if (stat(prog, &st) != 0 || !S_ISREG(st.st_mode))
            return error_set(FSDP_ENOTFOUND,
                             "script '%s' %s (fsdp-launch runs it as %s -u %s, like torchrun; use --no_python for a "
                             "program in PATH, -m for a module)",
                             prog, stat(prog, &st) != 0 ? "does not exist" : "is not a file", a->python, prog);
    }
    FSDP_TRY(find_python(a, out->program, sizeof out->program));
    out->python = true;
    out->argv = calloc((size_t)a->prog_argc + 6, sizeof *out->argv);
    if (!out->argv)
        return error_set(FSDP_ENOMEM, "out of memory");
    int n = 0;
    out->argv[n++] = (char *)a->python;
    out->argv[n++] = (char *)"-u";
    if (a->mode == LAUNCH_MODULE) {
        out->argv[n++] = (char *)"-m";
    } else if (a->mode == LAUNCH_RUN_PATH) {
        out->argv[n++] = (char *)"-c";
        out->argv[n++] = (char *)RUN_PATH_CODE;
    }
    for (int i = 0; i < a->prog_argc; i++)
        out->argv[n++] = a->prog_argv[i];
    return 0;
}

void command_free(struct launch_command *c)
{
    free(c->argv);
    c->argv = NULL;
}
