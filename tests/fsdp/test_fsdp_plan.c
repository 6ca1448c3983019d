/* The engine's config checks against the world and the device (fsdp_check_config) and the mesh it
 * describes, for context parallelism: a kernels table without context-parallel attention is refused by
 * name, the CPU's is accepted, and the mesh line names which ranks share rows and which share slices. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/config.h"
#include "common/error.h"
#include "kernels/kernels.h"
#include "worker/config/worker_config.h"
#include "worker/fsdp/fsdp.h"

static void cp_config(struct worker_config *wc, const char *cp)
{
    struct config *cfg = NULL;
    cr_assert_eq(config_create(worker_config_schema(), &cfg), 0, "%s", error_message());
    cr_assert_eq(config_set(cfg, "fsdp.context_parallel_size", cp), 0, "%s", error_message());
    cr_assert_eq(config_set(cfg, "train.train_batch", "4"), 0, "%s", error_message());
    cr_assert_eq(config_set(cfg, "train.micro_batch", "1"), 0, "%s", error_message());
    cr_assert_eq(worker_config_view(cfg, wc), 0, "%s", error_message());
    config_destroy(cfg);
}

Test(fsdp_plan, context_parallel_needs_the_kernels_attention)
{
    struct worker_config wc;
    cp_config(&wc, "2");
    cr_assert_eq(fsdp_check_config(&wc, 4, 4, kernels_cpu()), 0, "%s", error_message());
    struct kernels no_cp = *kernels_cpu();
    no_cp.name = "testdev";
    no_cp.attention_cp_backward = NULL;
    cr_assert_eq(fsdp_check_config(&wc, 4, 4, &no_cp), FSDP_EUNSUPPORTED);
    cr_assert(strstr(error_message(), "fsdp.context_parallel_size = 2 needs context-parallel attention, which the "
                                      "testdev kernels (train.device) do not have"),
              "%s", error_message());
    /* C = 1 needs nothing of the kind */
    cp_config(&wc, "1");
    cr_assert_eq(fsdp_check_config(&wc, 4, 4, &no_cp), 0, "%s", error_message());
}

Test(fsdp_plan, mesh_names_rows_and_slices)
{
    struct worker_config wc;
    cp_config(&wc, "2");
    struct fsdp_mesh m;
    fsdp_mesh_of(&wc, 4, &m);
    cr_assert_eq(m.dp, 2);
    cr_assert_eq(m.cp, 2);
    char buf[256];
    fsdp_mesh_describe(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "world 4 = 2 data-parallel x 2 context") && strstr(buf, "rows shared by [0 1] [2 3]") &&
                  strstr(buf, "different rows: [0 2] [1 3]"),
              "%s", buf);
}
