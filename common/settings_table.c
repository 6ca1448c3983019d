/* Every FSDP_* environment variable of the project, one entry each (common/settings.h says what a field
 * means). docs/environment.md is generated from this table; a test fails when a source reads or names an
 * FSDP_* variable that is not here. */
#include "common/settings.h"

#include <string.h>

#define END {NULL, NULL}

static const struct setting_value log_levels[] = {
    {"debug", NULL}, {"info", NULL}, {"warn", NULL}, {"error", NULL}, {"off", NULL}, END};
static const struct setting_alias log_level_aliases[] = {{"warning", "warn"}, END};
static const struct setting_value comm_backends[] = {
    {"cpu", "shared memory inside a host, TCP across hosts"}, {"nccl", "NCCL, from the GPU module"}, END};
static const struct setting_value peer_pages[] = {
    {"last", "the pages the latest operation read"},
    {"0", "none: every read faults them in"},
    {"1", "all ever read; RSS counts them"},
    END};
static const struct setting_value cpu_matmuls[] = {
    {"auto", "oneDNN where it is faster (an AVX-512 CPU, shapes past a small size), else OpenBLAS"},
    {"openblas", "OpenBLAS sgemm for every fp32 matmul"},
    {"onednn", "oneDNN for every fp32 matmul"},
    END};
static const struct setting_value kernels_backends[] = {{"cpu", NULL}, {"cuda", NULL}, END};

static const struct setting table[SETTING_COUNT] = {
    /* every program */
    {.id = SETTING_LOG_LEVEL, .name = "FSDP_LOG_LEVEL", .type = SETTING_ENUM, .def = "info", .values = log_levels,
     .aliases = log_level_aliases, .readers = SETTING_BY_LAUNCH | SETTING_BY_WORKER | SETTING_BY_PREPARE_DATA,
     .launcher_sets = true,
     .doc = "Least severe messages printed; `--log_level` on the command line wins. A value not allowed is a "
            "warning."},

    /* the launcher and the store */
    {.id = SETTING_RDZV_TOKEN, .name = "FSDP_RDZV_TOKEN", .type = SETTING_STRING, .format = "text",
     .def_doc = "the secret file (FSDP_RDZV_TOKEN_FILE); without one, one node: a random secret made by "
                "fsdp-launch, several nodes: none (a loud warning)",
     .readers = SETTING_BY_LAUNCH | SETTING_BY_WORKER | SETTING_BY_DEMO, .launcher_sets = true,
     .empty_is_value = true,
     .doc = "The job's store secret: with the run id it derives the key every fsdpc store connection proves "
            "it holds (never sent); several nodes need the same value on every node."},
    {.id = SETTING_RDZV_TOKEN_FILE, .name = "FSDP_RDZV_TOKEN_FILE", .type = SETTING_STRING, .format = "a path",
     .def_doc = "`$XDG_CONFIG_HOME/fsdpc/rdzv_token` (else `~/.config/fsdpc/rdzv_token`), used when it exists",
     .readers = SETTING_BY_LAUNCH | SETTING_BY_WORKER,
     .doc = "A file holding the store secret when FSDP_RDZV_TOKEN is unset: owned by the user and readable by "
            "nobody else (mode 600), else the program stops naming it."},
    {.id = SETTING_STORE_PREFIX, .name = "FSDP_STORE_PREFIX", .type = SETTING_STRING, .format = "a key prefix",
     .def_doc = "unset: the store is not fsdp-launch's (`rdzv_worker_connect` then uses `worker/`)",
     .readers = SETTING_BY_WORKER | SETTING_BY_DEMO, .launcher_sets = true, .empty_is_value = true,
     .doc = "Prefix of every key a worker puts in the store (`worker/g<generation>/`); when set, fsdp-worker "
            "uses the store at MASTER_ADDR:MASTER_PORT as fsdp-launch's."},
    {.id = SETTING_STORE_PORT, .name = "FSDP_STORE_PORT", .type = SETTING_INT, .min = 1, .max = 65535,
     .def_doc = "`MASTER_PORT` + 1", .readers = SETTING_BY_WORKER,
     .doc = "Port on which rank 0 hosts fsdp's store beside another launcher's (torchrun); it must be free. A "
            "value not allowed stops the worker."},
    {.id = SETTING_HEARTBEAT_TIMEOUT, .name = "FSDP_HEARTBEAT_TIMEOUT", .type = SETTING_DOUBLE, .def = "10",
     .min = 0, .min_exclusive = true, .readers = SETTING_BY_LAUNCH,
     .doc = "Seconds without a heartbeat before a node is declared lost, or a rank of fsdp-worker whose process "
            "lives is declared stopped; at least 3 x `--monitor_interval`."},

    /* the worker */
    {.id = SETTING_GPU_MODULE, .name = "FSDP_GPU_MODULE", .type = SETTING_STRING, .format = "a path",
     .def_doc = "`BUILD/libfsdp_gpu.so` for a program in the build tree, else `LIBDIR/fsdp/libfsdp_gpu.so`, "
                "each falling back to the other",
     .readers = SETTING_BY_WORKER,
     .doc = "The GPU module (CUDA kernels, NCCL backend) to load; when set, only this file is tried."},
    {.id = SETTING_CUDA_TF32, .name = "FSDP_CUDA_TF32", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_WORKER,
     .doc = "fp32 matmuls on TF32 tensor cores (10-bit mantissa products, fp32 accumulation); off: exact fp32, "
            "as on the CPU."},
    /* the CUDA host emulator (gpu/emu/, its module libfsdp_gpu_emu.so) */
    {.id = SETTING_GPU_EMU_DEVICES, .name = "FSDP_GPU_EMU_DEVICES", .type = SETTING_INT, .def = "8", .min = 1,
     .max = 64, .readers = SETTING_BY_WORKER,
     .doc = "CUDA host emulator: the number of devices it reports; each process emulates its own, so the ranks "
            "of one machine each take one."},
    {.id = SETTING_GPU_EMU_SMS, .name = "FSDP_GPU_EMU_SMS", .type = SETTING_INT, .def = "4", .min = 1, .max = 256,
     .readers = SETTING_BY_WORKER,
     .doc = "CUDA host emulator: the multiprocessors its device reports (the kernels size their grids by it)."},
    {.id = SETTING_GPU_EMU_MEMORY_GIB, .name = "FSDP_GPU_EMU_MEMORY_GIB", .type = SETTING_INT, .def = "16",
     .min = 1, .max = 4096, .readers = SETTING_BY_WORKER,
     .doc = "CUDA host emulator: its device memory in GiB (address space reserved twice over, used as allocated)."},
    {.id = SETTING_GPU_EMU_DELAY_US, .name = "FSDP_GPU_EMU_DELAY_US", .type = SETTING_INT, .def = "0", .min = 0,
     .max = 1000000, .readers = SETTING_BY_WORKER, .test_only = true,
     .doc = "CUDA host emulator: a random delay of up to this many microseconds before each op of every stream, "
            "so a missing event wait or stream synchronisation becomes a race that loses often."},
    {.id = SETTING_GPU_EMU_SEED, .name = "FSDP_GPU_EMU_SEED", .type = SETTING_INT, .min = 0,
     .max = 9007199254740991LL, .def_doc = "unset: from the process id and the clock", .readers = SETTING_BY_WORKER,
     .test_only = true, .doc = "CUDA host emulator: the seed of its random delays."},
    {.id = SETTING_GPU_EMU_TRACE_DIR, .name = "FSDP_GPU_EMU_TRACE_DIR", .type = SETTING_STRING, .format = "a directory",
     .def_doc = "unset: no trace", .readers = SETTING_BY_WORKER,
     .doc = "CUDA host emulator: write each process's stream trace (every op's start and end on its stream, and the "
            "host's waits for the device, at most 1,000,000 events) at exit to DIR/trace-PID.json, in the Chrome "
            "trace-event format."},
    {.id = SETTING_PEAK_TFLOPS, .name = "FSDP_PEAK_TFLOPS", .type = SETTING_DOUBLE, .min = 0,
     .min_exclusive = true,
     .def_doc = "measured on the CPU by a short SGEMM at start; unknown (no MFU) on other devices",
     .readers = SETTING_BY_WORKER, .doc = "Peak TFLOP/s of one rank: the denominator of the MFU it reports."},
    {.id = SETTING_REGISTERED_BUFFERS, .name = "FSDP_REGISTERED_BUFFERS", .type = SETTING_BOOL, .def = "1",
     .readers = SETTING_BY_WORKER,
     .doc = "0: the engine does not register its buffers with the communicator, so every transfer is staged "
            "(for comparing the two paths)."},
    {.id = SETTING_CPU_MATMUL, .name = "FSDP_CPU_MATMUL", .type = SETTING_ENUM, .def = "auto",
     .values = cpu_matmuls, .readers = SETTING_BY_WORKER | SETTING_BY_TESTS,
     .doc = "Library of the CPU backend's fp32 matmuls (bf16 ones always run on oneDNN); read once per "
            "process, a value not allowed is a warning."},

    /* the collectives (comm/) */
    {.id = SETTING_COMM_TIMEOUT_S, .name = "FSDP_COMM_TIMEOUT_S", .type = SETTING_DOUBLE, .def = "600", .min = 0,
     .min_exclusive = true, .readers = SETTING_BY_WORKER | SETTING_BY_COMM,
     .doc = "Seconds each wait of one collective (and a communicator's creation) may take before it fails "
            "naming the ranks that did not arrive."},
    {.id = SETTING_COMM_BACKEND, .name = "FSDP_COMM_BACKEND", .type = SETTING_ENUM, .def = "cpu",
     .values = comm_backends, .readers = SETTING_BY_COMM,
     .doc = "Communicator backend when `comm_options.backend` is unset (fsdp-worker picks it from "
            "`train.device`); a value not allowed fails `comm_create`."},
    {.id = SETTING_RDZV_GENERATION, .name = "FSDP_RDZV_GENERATION", .type = SETTING_INT, .def = "0", .min = 0,
     .max = 2147483647, .readers = SETTING_BY_COMM,
     .doc = "Generation in a communicator's store keys when `comm_options.generation` < 0 (fsdp-worker passes "
            "its restart count)."},
    {.id = SETTING_RUN_ID, .name = "FSDP_RUN_ID", .type = SETTING_STRING, .format = "text",
     .def_doc = "`TORCHELASTIC_RUN_ID`, else `local`", .readers = SETTING_BY_WORKER | SETTING_BY_COMM,
     .doc = "Part of the shared-memory segment names, so that jobs on one host stay apart."},
    {.id = SETTING_COMM_SHM_SLOT_KIB, .name = "FSDP_COMM_SHM_SLOT_KIB", .type = SETTING_INT, .def = "1024",
     .min = 64, .max = 4194304, .readers = SETTING_BY_WORKER | SETTING_BY_COMM,
     .doc = "Shared-memory slot per rank, in KiB: a staged collective moves its buffers in pieces of one slot "
            "per rank."},
    {.id = SETTING_COMM_SHM_DIRECT, .name = "FSDP_COMM_SHM_DIRECT", .type = SETTING_BOOL, .def = "1",
     .readers = SETTING_BY_WORKER | SETTING_BY_COMM,
     .doc = "0: registered buffers take the staged path too; one rank with 0 turns direct reads off for its "
            "whole group."},
    {.id = SETTING_COMM_SHM_KEEP_PEER_PAGES, .name = "FSDP_COMM_SHM_KEEP_PEER_PAGES", .type = SETTING_ENUM,
     .def = "last", .values = peer_pages, .readers = SETTING_BY_WORKER | SETTING_BY_COMM,
     .doc = "Peer pages a rank keeps mapped after a one-copy read; read per rank when a communicator is "
            "created, which a value not allowed fails."},
    {.id = SETTING_COMM_FORCE_TCP, .name = "FSDP_COMM_FORCE_TCP", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_WORKER | SETTING_BY_COMM,
     .doc = "Every rank is its own host: TCP only, no shared memory (tests and debugging)."},

    /* examples/ */
    {.id = SETTING_DEMO_QUIET, .name = "FSDP_DEMO_QUIET", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_DEMO,
     .doc = "The demo prints nothing after the barrier (the launcher benchmark times it so)."},

    /* test hooks: read by the programs, set by tests */
    {.id = SETTING_FAULT_KILL, .name = "FSDP_FAULT_KILL", .type = SETTING_STRING, .format = "STEP:RANK",
     .def_doc = "unset: off", .readers = SETTING_BY_WORKER, .test_only = true,
     .doc = "That rank SIGKILLs itself when it reaches STEP, on the first attempt only: tests crash a run at "
            "a chosen point (also a way to rehearse recovery)."},
    {.id = SETTING_TEST_OFFLOAD, .name = "FSDP_TEST_OFFLOAD", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_WORKER, .test_only = true,
     .doc = "`fsdp.offload_params` runs its staging path on the CPU backend too, where offload otherwise "
            "changes nothing."},
    {.id = SETTING_COMM_HOST_ID, .name = "FSDP_COMM_HOST_ID", .type = SETTING_STRING, .format = "text",
     .def_doc = "unset: hostname, boot id and network namespace tell hosts apart",
     .readers = SETTING_BY_WORKER | SETTING_BY_COMM, .test_only = true,
     .doc = "Ranks with the same value are one host: fakes several hosts on one machine."},
    {.id = SETTING_TEST_GPU_HOST, .name = "FSDP_TEST_GPU_HOST", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_WORKER | SETTING_BY_TESTS, .test_only = true,
     .doc = "1: the driver probe says an NVIDIA driver is present, so a GPU test fails where it would skip, "
            "and with FSDP_TEST_GPU_COUNT > 0 `train.device = auto` means cuda. The test suite sets both for its CPU "
            "tests: a test config that leaves the device to auto fails here as it would on a GPU host."},
    {.id = SETTING_TEST_GPU_COUNT, .name = "FSDP_TEST_GPU_COUNT", .type = SETTING_INT, .min = 0, .max = 1024,
     .def_doc = "unset: the driver's count (0 without a driver)", .readers = SETTING_BY_WORKER | SETTING_BY_TESTS,
     .test_only = true,
     .doc = "The number of CUDA devices the device-count probe reports (the check of a node's ranks against its "
            "GPUs), without asking the driver."},
    {.id = SETTING_TEST_COMM_SERIAL, .name = "FSDP_TEST_COMM_SERIAL", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_COMM, .test_only = true,
     .doc = "1: the cpu backend runs its operations as the nccl backend does: those of every communicator of "
            "the process on one progress thread in issue order, with comm_mem_alloc/free between them."},
    {.id = SETTING_TEST_CPU_NO_BF16, .name = "FSDP_TEST_CPU_NO_BF16", .type = SETTING_BOOL, .def = "0",
     .readers = SETTING_BY_WORKER | SETTING_BY_TESTS, .test_only = true,
     .doc = "The CPU backend acts as if the CPU had no bf16 instructions (oneDNN capped at AVX-512 without "
            "BF16): `mixed_precision = bf16` then takes the fp32-compute fallback."},

    /* the test suite's harness */
    {.id = SETTING_BUILD_ROOT, .name = "FSDP_BUILD_ROOT", .type = SETTING_STRING, .format = "a path",
     .def_doc = "set by `meson test`", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "The build directory: tests and benchmarks find the programs under test there, never through "
            "PATH."},
    {.id = SETTING_SOURCE_ROOT, .name = "FSDP_SOURCE_ROOT", .type = SETTING_STRING, .format = "a path",
     .def_doc = "set by `meson test`", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "The source tree: tests read docs/, examples/ and the sources there."},
    {.id = SETTING_KERNELS_BACKEND, .name = "FSDP_KERNELS_BACKEND", .type = SETTING_ENUM, .def = "cpu",
     .values = kernels_backends, .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "The kernels backend the tests/kernels binaries test (their `kernels_*_cuda` runs set cuda)."},
    {.id = SETTING_TORCHRUN, .name = "FSDP_TORCHRUN", .type = SETTING_STRING, .format = "a path",
     .def_doc = "unset: `torchrun` on PATH, then the PyPI venv's (FSDP_TORCH_VENV)", .readers = SETTING_BY_TESTS,
     .test_only = true, .doc = "The torchrun the torchrun test launches fsdp-worker with; without one it skips."},
    {.id = SETTING_TORCH_VENV, .name = "FSDP_TORCH_VENV", .type = SETTING_STRING, .format = "a path",
     .def_doc = "unset: ~/.cache/fsdpc-venv", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "The venv with the PyPI peers (PyTorch 2.x, transformers, tokenizers, ...) that tests and benchmarks "
            "compare with; .ci/run makes it when missing. Tests that need it skip without it."},
    {.id = SETTING_TEST_NCCL_WORLD, .name = "FSDP_TEST_NCCL_WORLD", .type = SETTING_INT, .min = 1, .max = 16,
     .def_doc = "unset: one rank per visible GPU, at most 4", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "Ranks of the NCCL tests (tests/comm/test_comm_nccl.c); rank r uses GPU r modulo the GPUs "
            "visible, so 2 on one GPU asks NCCL to put two ranks on one device."},
    {.id = SETTING_TEST_GROW_MODULE, .name = "FSDP_TEST_GROW_MODULE", .type = SETTING_STRING, .format = "a path",
     .def_doc = "set by `meson test`", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "The module (tests/tools/grow_on_read.c) that tools_prepare_data preloads into fsdp-prepare-data to "
            "grow an input while it is read."},
    {.id = SETTING_TEST_GROW_FILE, .name = "FSDP_TEST_GROW_FILE", .type = SETTING_STRING, .format = "a path",
     .def_doc = "unset: nothing grows", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "For the preloaded grow_on_read module: the input that gets FSDP_TEST_GROW_WITH appended when it is "
            "first read."},
    {.id = SETTING_TEST_GROW_WITH, .name = "FSDP_TEST_GROW_WITH", .type = SETTING_STRING, .format = "a path",
     .def_doc = "unset: nothing grows", .readers = SETTING_BY_TESTS, .test_only = true,
     .doc = "For the preloaded grow_on_read module: the file whose bytes are appended to FSDP_TEST_GROW_FILE."},

    /* the launcher to the worker */
    {.id = SETTING_LAUNCH_CONFIG, .name = "FSDP_LAUNCH_CONFIG", .type = SETTING_STRING, .format = "JSON",
     .def_doc = "unset: none", .readers = SETTING_BY_WORKER, .launcher_sets = true,
     .doc = "Worker settings from fsdp-launch's `--config_file` (accelerate YAML, applied under the INI file) "
            "and its accelerate-style flags (applied over it); docs/launcher.md has the format."},
    {.id = SETTING_HEARTBEAT_FD, .name = "FSDP_HEARTBEAT_FD", .type = SETTING_INT, .min = 0, .max = 1 << 20,
     .def_doc = "unset: none", .readers = SETTING_BY_WORKER, .launcher_sets = true,
     .doc = "The pipe on which fsdp-worker sends fsdp-launch a heartbeat every 0.5 s, so that a rank whose "
            "process lives but stops (SIGSTOP, frozen) is named within FSDP_HEARTBEAT_TIMEOUT."},
};

const struct setting *settings_entry(enum setting_id id)
{
    return (unsigned)id < SETTING_COUNT ? &table[id] : NULL;
}

const struct setting *settings_find(const char *name)
{
    for (size_t i = 0; name && i < SETTING_COUNT; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}
