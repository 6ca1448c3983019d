/* What `latest` means under a checkpoint root: the newest committed checkpoint directory there (the highest
 * step among fsdp_sharded_cpt<N>/ and fsdp_cpt<N>/), as a scan of torch/accelerate-style checkpoint folders
 * would pick it. The `latest` file is the pointer every commit rewrites last; it is trusted only when it
 * agrees with the directory, so a pointer that is missing, damaged, dangling or older than the newest
 * checkpoint (a save stopped between its rename and the pointer's update) never sends a run back to step 0
 * or to an older checkpoint: the newest one is used and the note says what was wrong with the pointer.
 * Also the resolution of every `which` a reader is opened with. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "worker/ckpt/ckpt_internal.h"

/* Notes hold paths that may be long: cut to fit (through vsnprintf, which is not checked for truncation). */
__attribute__((format(printf, 3, 4))) static void say(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}

/* The pointer's first line, when it is a checkpoint name; otherwise why not (for the note). */
static bool read_pointer(const char *root, char *name, size_t cap, char *why, size_t why_cap)
{
    char path[FSDP_PATH_MAX];
    ckpt_pathf(path, "%s/%s", root, CKPT_LATEST);
    /* O_NONBLOCK: a FIFO named `latest` must not hang the resume. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            say(why, why_cap, "%s is missing", path);
        else
            say(why, why_cap, "%s cannot be read (%s)", path, strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        say(why, why_cap, "%s is not a regular file", path);
        return false;
    }
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) {
        say(why, why_cap, "%s cannot be read (%s)", path, strerror(errno));
        return false;
    }
    buf[n] = '\0';
    size_t len = strcspn(buf, "\n");
    bool whole_line = len < (size_t)n || (size_t)n < sizeof buf - 1;
    buf[len] = '\0';
    if (whole_line && len < cap && ckpt_name_step(buf) >= 0) {
        memcpy(name, buf, len + 1);
        return true;
    }
    /* Shown escaped and cut: the file may hold anything. */
    char shown[64];
    size_t k = 0;
    for (size_t i = 0; i < len && k + 5 < sizeof shown; i++)
        k += (size_t)snprintf(shown + k, sizeof shown - k, isprint((unsigned char)buf[i]) ? "%c" : "\\x%02x",
                              (unsigned char)buf[i]);
    shown[k] = '\0';
    say(why, why_cap, "%s does not hold a checkpoint name (it starts '%s'%s, %lld bytes)", path, shown,
             k < len || !whole_line ? "..." : "", (long long)st.st_size);
    return false;
}

struct entry {
    char name[256];
    int64_t step;
};

static int cmp_desc(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    if (x->step != y->step)
        return (x->step < y->step) - (x->step > y->step);
    return strcmp(x->name, y->name);
}

/* Committed checkpoints under root (directories with a checkpoint name; `.tmp_*` saves in progress are
 * not), newest first. *n = 0 when root does not exist. */
static int scan(const char *root, struct entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        return error_set(FSDP_EIO, "%s: cannot list the checkpoint directory: %s", root, strerror(errno));
    }
    struct entry *list = NULL;
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step = ckpt_name_step(e->d_name);
        if (step < 0 || strlen(e->d_name) >= sizeof list->name)
            continue;
        char path[FSDP_PATH_MAX];
        struct stat st;
        ckpt_pathf(path, "%s/%s", root, e->d_name);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            struct entry *nl = realloc(list, cap * sizeof *list);
            if (!nl) {
                rc = error_set(FSDP_ENOMEM, "out of memory listing %s", root);
                goto out;
            }
            list = nl;
        }
        snprintf(list[*n].name, sizeof list[*n].name, "%s", e->d_name);
        list[(*n)++].step = step;
    }
    if (*n)
        qsort(list, *n, sizeof *list, cmp_desc);
    *out = list;
    list = NULL;
out:
    closedir(d);
    free(list);
    if (rc)
        *n = 0;
    return rc;
}

int ckpt_find_latest(const char *root, struct ckpt_latest *out)
{
    memset(out, 0, sizeof *out);
    out->step = -1;
    struct entry *list;
    size_t n;
    FSDP_TRY(scan(root, &list, &n));
    char pointer[256] = "", why[sizeof out->note] = "";
    bool have_pointer = read_pointer(root, pointer, sizeof pointer, why, sizeof why);
    if (n == 0) {
        if (have_pointer)
            say(out->note, sizeof out->note, "%s/%s names %s, which does not exist, and %s holds no checkpoint",
                     root, CKPT_LATEST, pointer, root);
        free(list);
        return 0;
    }
    /* Of two checkpoints of the newest step (both formats), the one the pointer names. */
    size_t pick = 0;
    for (size_t i = 1; i < n && list[i].step == list[0].step; i++)
        if (have_pointer && strcmp(list[i].name, pointer) == 0)
            pick = i;
    ckpt_pathf(out->path, "%s/%s", root, list[pick].name);
    out->step = list[pick].step;
    for (size_t i = 0; i < n; i++)
        if (i != pick && list[i].step < out->step) {
            say(out->older, sizeof out->older, "%s", list[i].name);
            break;
        }
    if (have_pointer && strcmp(pointer, list[pick].name) != 0) {
        bool exists = false;
        for (size_t i = 0; i < n; i++)
            exists = exists || strcmp(list[i].name, pointer) == 0;
        if (exists)
            say(why, sizeof why, "%s/%s names %s, an older checkpoint (a save stopped between its commit and "
                     "the pointer's update)", root, CKPT_LATEST, pointer);
        else
            say(why, sizeof why, "%s/%s names %s, which does not exist", root, CKPT_LATEST, pointer);
        have_pointer = false;
    }
    if (!have_pointer)
        say(out->note, sizeof out->note, "%s; the newest checkpoint in the directory is %s (step %lld)", why,
                 list[pick].name, (long long)out->step);
    free(list);
    return 0;
}

int ckpt_list_after(const char *root, int64_t step, char *names, size_t cap)
{
    struct entry *list;
    size_t n;
    if (cap)
        names[0] = '\0';
    if (scan(root, &list, &n) != 0)
        return 0;
    int count = 0;
    size_t used = 0;
    for (size_t i = n; i-- > 0;) /* oldest first, as a reader expects a list of steps */
        if (list[i].step > step) {
            count++;
            int w = snprintf(names + used, cap > used ? cap - used : 0, "%s%s", used ? ", " : "", list[i].name);
            if (w > 0 && used + (size_t)w < cap)
                used += (size_t)w;
        }
    free(list);
    return count;
}

int ckpt_resolve(const char *root, const char *which, char *out, size_t cap)
{
    char name[FSDP_PATH_MAX];
    struct stat st;
    FSDP_TRY(ckpt_check_resume_target(root, which));
    if (!which || !*which) {
        snprintf(name, sizeof name, "%s", root);
    } else if (strcmp(which, CKPT_LATEST) == 0) {
        struct ckpt_latest l;
        FSDP_TRY(ckpt_find_latest(root, &l));
        if (l.note[0])
            log_warn("%s", l.note);
        if (!l.path[0])
            return error_set(FSDP_ENOTFOUND, "%s: no checkpoint yet (no fsdp_sharded_cpt<N> or fsdp_cpt<N> "
                             "directory)", root);
        snprintf(name, sizeof name, "%s", l.path);
    } else if (which[0] == '/' || stat(which, &st) == 0) {
        snprintf(name, sizeof name, "%s", which);
    } else {
        snprintf(name, sizeof name, "%s/%s", root, which);
    }
    if (stat(name, &st) != 0 || !S_ISDIR(st.st_mode))
        return error_set(FSDP_ENOTFOUND, "%s: no such checkpoint directory", name);
    if (strlen(name) >= cap)
        return error_set(FSDP_ERANGE, "%s: path too long", name);
    memcpy(out, name, strlen(name) + 1);
    return 0;
}
