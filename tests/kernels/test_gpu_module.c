/* The GPU module (common/gpu_module.h): CPU work never maps CUDA; asking for the CUDA table loads the module,
 * and its errors reach the caller through the program's own error_set (export_dynamic); a bad explicit path
 * is named in the error. Each Criterion test runs in its own process, so each starts with nothing loaded. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/gpu_module.h"
#include "kernels/kernels.h"
#include "tests/util/tu_file.h"
#include "tests/util/tu_proc.h"

/* Whether a file whose path contains needle is mapped into this process. */
static bool mapped(const char *needle)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

Test(gpu_module, cpu_work_maps_no_cuda)
{
    const struct kernels *k = kernels_get("cpu");
    cr_assert_not_null(k);
    float x[4] = {1, 2, 3, 4};
    double s = 0;
    cr_assert_eq(k->sqnorm(&s, x, 4), 0);
    cr_assert_eq(s, 30.0);
    cr_assert_not(mapped("libcudart"), "a CPU-only process mapped libcudart");
    cr_assert_not(mapped("libnccl"), "a CPU-only process mapped libnccl");
    cr_assert_not(mapped("libfsdp_gpu"), "a CPU-only process mapped the GPU module");
    cr_assert_str_eq(gpu_module_path(), "");
}

Test(gpu_module, cuda_request_loads_the_module_or_says_why)
{
    error_clear();
    const struct kernels *k = kernels_get("cuda");
    const char *msg = error_message();
#ifdef FSDP_HAVE_CUDA
    /* The module loaded (RTLD_NOW: every CUDA library and symbol resolved) whether or not a GPU is here. */
    cr_assert(mapped("libfsdp_gpu.so"), "kernels_get(\"cuda\") did not load the module: %s", msg);
    cr_assert(mapped("libcudart"), "the module is loaded but libcudart is not mapped");
    cr_assert(strstr(gpu_module_path(), "libfsdp_gpu.so"), "path %s", gpu_module_path());
    if (k)
        cr_assert_str_eq(k->name, "cuda");
    else /* set inside the module, read here: the module bound to this program's error_set */
        cr_assert(strstr(msg, "no CUDA device"), "unexpected message: %s", msg);
#else
    cr_assert_null(k);
    cr_assert(strstr(msg, "no GPU support") && strstr(msg, "-Dcuda=enabled"), "unclear message: %s", msg);
    cr_assert_not(mapped("libfsdp_gpu"));
#endif
}

Test(gpu_module, bad_explicit_path_is_named)
{
    cr_assert_eq(setenv("FSDP_GPU_MODULE", "/nonexistent/dir/libfsdp_gpu.so", 1), 0);
    error_clear();
    cr_assert_null(kernels_get("cuda"));
    const char *msg = error_message();
    /* every build tries a module named explicitly (the CUDA host emulator's needs no CUDA build) */
    cr_assert(strstr(msg, "/nonexistent/dir/libfsdp_gpu.so") && strstr(msg, "cannot load the GPU module"),
              "the message does not name the path: %s", msg);
    /* The CPU table stays usable. */
    cr_assert_not_null(kernels_get("cpu"));
}

/* A GPU test that cannot run on a host with an NVIDIA driver fails instead of skipping (tests/util/tu_gpu.h):
 * a CUDA build whose GPU tests all skip there (a driver too old for the build: error 35) must not pass. A
 * build without CUDA has nothing to run, so its test still skips. */
Test(gpu_module, gpu_test_on_a_gpu_host_fails_instead_of_skipping, .timeout = 60)
{
    const char *root = getenv("FSDP_BUILD_ROOT");
    cr_assert(root, "FSDP_BUILD_ROOT not set: run through meson test");
    char exe[FSDP_PATH_MAX], dir[] = "/tmp/fsdp-gpu-skip-XXXXXX", out[FSDP_PATH_MAX];
    snprintf(exe, sizeof exe, "%s/tests/kernels/test_kernels_cuda", root);
    cr_assert(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/out", dir);
    const char *argv[] = {exe, "--filter=kernels_cuda/matmul_matches_cpu", NULL};
    /* BXFI_MAP tells a Criterion binary it is one of this runner's test processes: the inner one must not
     * think so. */
    /* The driver is there (FSDP_TEST_GPU_HOST=1 fakes it where it is not) but no device is usable (-1 in
     * CUDA_VISIBLE_DEVICES hides them where there are some): what a driver too old for the build looks like. */
    const char *faked[] = {"FSDP_TEST_GPU_HOST=1", "CUDA_VISIBLE_DEVICES=-1", "CRITERION_VERBOSITY_LEVEL=1",
                           "BXFI_MAP=", NULL};
    int code = tu_run(argv, out, out, faked);
    char *text = tu_slurp(out);
    cr_assert(text, "no output from %s", exe);
#ifdef FSDP_HAVE_CUDA
    cr_assert_neq(code, 0, "a CUDA test skipped on a (faked) GPU host and the binary passed:\n%s", text);
    cr_assert(strstr(text, "an NVIDIA driver is present"), "the failure does not say why:\n%s", text);
#else
    cr_assert_eq(code, 0, "a build without CUDA failed its GPU test (exit %d):\n%s", code, text);
    cr_assert(strstr(text, "[SKIP]") && strstr(text, "no GPU support"), "no skip reported:\n%s", text);
#endif
    /* The same binary on this host as it is: a skip, and a pass of the binary. */
    const char *plain[] = {"FSDP_TEST_GPU_HOST=", "CRITERION_VERBOSITY_LEVEL=1", "BXFI_MAP=", NULL};
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/proc/driver/nvidia/version", F_OK) != 0)
        cr_assert_eq(tu_run(argv, out, out, plain), 0, "the GPU test failed on a host without a driver");
    free(text);
    unlink(out);
    rmdir(dir);
}
