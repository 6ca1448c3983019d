/* The GPU module (common/gpu_module.h): CPU work never maps CUDA; asking for the CUDA table loads the module,
 * and its errors reach the caller through the program's own error_set (export_dynamic); a bad explicit path
 * is named in the error. Each Criterion test runs in its own process, so each starts with nothing loaded. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/gpu_module.h"
#include "kernels/kernels.h"

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
#ifdef FSDP_HAVE_CUDA
    cr_assert(strstr(msg, "/nonexistent/dir/libfsdp_gpu.so") && strstr(msg, "cannot load the GPU module"),
              "the message does not name the path: %s", msg);
#else
    cr_assert(strstr(msg, "no GPU support"), "unclear message: %s", msg);
#endif
    /* The CPU table stays usable. */
    cr_assert_not_null(kernels_get("cpu"));
}
