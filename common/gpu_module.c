/* Loads libfsdp_gpu.so once (see gpu_module.h for why it is not linked). The programs are linked with
 * --export-dynamic so that the module's calls to error_set, log_* and the store client bind to the
 * program's own copies: an error message set inside the module is then the one the caller reads. */
#include "common/gpu_module.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/settings.h"

#ifndef FSDP_GPU_MODULE_BUILD_PATH
#define FSDP_GPU_MODULE_BUILD_PATH ""
#endif
#ifndef FSDP_GPU_MODULE_INSTALL_PATH
#define FSDP_GPU_MODULE_INSTALL_PATH ""
#endif
#ifndef FSDP_GPU_BUILD_ROOT
#define FSDP_GPU_BUILD_ROOT ""
#endif

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static void *handle;
static char loaded_path[FSDP_PATH_MAX];
static char load_error[4096];

bool gpu_module_driver_present(void)
{
    if (settings_bool(SETTING_TEST_GPU_HOST))
        return true;
    return access("/proc/driver/nvidia/version", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0 ||
           access("/dev/nvidia0", F_OK) == 0;
}

#ifdef FSDP_HAVE_CUDA
/* A program run from the build tree loads the module built beside it, an installed one the installed
 * module: a stale installed copy must never shadow the one just built. */
static bool exe_in_build_tree(void)
{
    char exe[FSDP_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    size_t rl = strlen(FSDP_GPU_BUILD_ROOT);
    if (n <= 0 || rl == 0)
        return false;
    exe[n] = '\0';
    return strncmp(exe, FSDP_GPU_BUILD_ROOT, rl) == 0 && exe[rl] == '/';
}

static bool try_load(const char *path, size_t *used)
{
    if (!path[0])
        return false;
    /* RTLD_NOW: a missing CUDA library or symbol is reported here, with its name, not at the first call. */
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle) {
        snprintf(loaded_path, sizeof(loaded_path), "%s", path);
        return true;
    }
    const char *why = dlerror();
    int k = snprintf(load_error + *used, sizeof(load_error) - *used, "%s%s", *used ? "; " : "",
                     why ? why : path);
    if (k > 0)
        *used = *used + (size_t)k < sizeof(load_error) ? *used + (size_t)k : sizeof(load_error) - 1;
    return false;
}

static void load(void)
{
    size_t used = 0;
    const char *env = settings_get_string(SETTING_GPU_MODULE);
    if (env) {
        snprintf(loaded_path, sizeof(loaded_path), "%s", env);
        if (!try_load(env, &used))
            loaded_path[0] = '\0';
        return; /* an explicit path is the only one tried */
    }
    bool built = exe_in_build_tree();
    if (!try_load(built ? FSDP_GPU_MODULE_BUILD_PATH : FSDP_GPU_MODULE_INSTALL_PATH, &used))
        try_load(built ? FSDP_GPU_MODULE_INSTALL_PATH : FSDP_GPU_MODULE_BUILD_PATH, &used);
}
#else
/* No module of this build's own, but a module named by FSDP_GPU_MODULE is tried: the CUDA host emulator
 * (gpu/libfsdp_gpu_emu.so, -Dgpu_emu=true) needs no CUDA toolkit beyond its headers. */
static bool try_load(const char *path, size_t *used)
{
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle) {
        snprintf(loaded_path, sizeof(loaded_path), "%s", path);
        return true;
    }
    const char *why = dlerror();
    snprintf(load_error, sizeof(load_error), "%s", why ? why : path);
    *used = strlen(load_error);
    return false;
}

static void load(void)
{
    size_t used = 0;
    const char *env = settings_get_string(SETTING_GPU_MODULE);
    if (env) {
        if (!try_load(env, &used))
            loaded_path[0] = '\0';
        return;
    }
    snprintf(load_error, sizeof(load_error), "this build has no GPU support (built without the CUDA toolkit "
                                             "and NCCL; rebuild with meson -Dcuda=enabled)");
}
#endif

void *gpu_module_symbol(const char *name)
{
    pthread_once(&load_once, load);
    if (!handle) {
        error_set(FSDP_EUNSUPPORTED, "cannot load the GPU module libfsdp_gpu.so: %s", load_error);
        return NULL;
    }
    dlerror();
    void *p = dlsym(handle, name);
    if (!p)
        error_set(FSDP_EUNSUPPORTED, "the GPU module %s has no symbol %s (a module from another build?)",
                  loaded_path, name);
    return p;
}

int gpu_module_device_count(char *why, size_t cap)
{
    char none[8];
    if (!why || cap == 0) {
        why = none;
        cap = sizeof none;
    }
    why[0] = '\0';
    if (settings_get_raw(SETTING_TEST_GPU_COUNT)) {
        int n = (int)settings_int(SETTING_TEST_GPU_COUNT);
        if (n == 0)
            snprintf(why, cap, "FSDP_TEST_GPU_COUNT=0");
        return n;
    }
    /* a module named explicitly answers for itself (the CUDA host emulator runs without a driver) */
    if (!gpu_module_driver_present() && !settings_get_string(SETTING_GPU_MODULE)) {
        snprintf(why, cap, "no NVIDIA driver on this host (no /proc/driver/nvidia/version, /dev/nvidiactl or "
                           "/dev/nvidia0)");
        return 0;
    }
    int (*count)(char *, size_t) = (int (*)(char *, size_t))gpu_module_symbol("fsdp_gpu_device_count");
    if (!count) {
        snprintf(why, cap, "%s", error_message());
        return 0;
    }
    return count(why, cap);
}

const char *gpu_module_emulator(void)
{
    pthread_once(&load_once, load);
    if (!handle)
        return NULL;
    const char *(*what)(void) = (const char *(*)(void))dlsym(handle, "fsdp_gpu_emulator");
    return what ? what() : NULL;
}

const char *gpu_module_path(void)
{
    return loaded_path;
}
