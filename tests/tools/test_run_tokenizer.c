/* Finding a run's tokenizer from a checkpoint (worker/tools/run_tokenizer.h) and the byte progress bar's
 * line. */
#include "common/error.h"
#include "tests/util/tooltest.h"
#include "worker/tools/byte_progress.h"
#include "worker/tools/run_tokenizer.h"

TestSuite(run_tokenizer, .init = tt_setup, .fini = tt_teardown);

Test(run_tokenizer, config_values)
{
    const char *ini = "# effective config\n[model]\ntrain_file = wrong\n\n[data]\n"
                      "  train_file = \"runs/d/train.bin\"  \nval_file =\n; comment = x\n[log]\ndir = r\n";
    char v[256];
    cr_assert_eq(run_config_value(ini, "data", "train_file", v, sizeof v), 0);
    cr_assert_str_eq(v, "runs/d/train.bin");
    cr_assert_eq(run_config_value(ini, "data", "val_file", v, sizeof v), FSDP_ENOTFOUND);
    cr_assert_eq(run_config_value(ini, "data", "comment", v, sizeof v), FSDP_ENOTFOUND);
    cr_assert_eq(run_config_value(ini, "log", "dir", v, sizeof v), 0);
    cr_assert_str_eq(v, "r");
    cr_assert_eq(run_config_value(NULL, "log", "dir", v, sizeof v), FSDP_ENOTFOUND);
}

Test(run_tokenizer, checkpoint_dir_then_data_dir)
{
    char ckpt[256], data[256], p[512], ini[1024], found[1024];
    tt_path(ckpt, sizeof ckpt, "ckpt");
    tt_path(data, sizeof data, "data");
    cr_assert_eq(mkdir(ckpt, 0755), 0);
    cr_assert_eq(mkdir(data, 0755), 0);
    snprintf(ini, sizeof ini, "[data]\ntrain_file = %s/train.bin\n", data);
    /* nothing anywhere */
    cr_assert_eq(run_tokenizer_find(ckpt, ini, found, sizeof found), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "no tokenizer at"), "%s", error_message());
    /* beside train_file, without meta.json */
    snprintf(p, sizeof p, "%s/tokenizer.json", data);
    tu_write_ok(p, "{}", 2);
    cr_assert_eq(run_tokenizer_find(ckpt, ini, found, sizeof found), 0, "%s", error_message());
    cr_assert_str_eq(found, p);
    /* meta.json names the file; null means bytes */
    snprintf(p, sizeof p, "%s/meta.json", data);
    tu_write_ok(p, "{\"tokenizer\": \"other.json\"}", 27);
    snprintf(p, sizeof p, "%s/other.json", data);
    tu_write_ok(p, "{}", 2);
    cr_assert_eq(run_tokenizer_find(ckpt, ini, found, sizeof found), 0, "%s", error_message());
    cr_assert_str_eq(found, p);
    snprintf(p, sizeof p, "%s/meta.json", data);
    tu_write_ok(p, "{\"tokenizer\": null}", 19);
    cr_assert_eq(run_tokenizer_find(ckpt, ini, found, sizeof found), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "bytes"), "%s", error_message());
    /* the checkpoint directory's own comes first */
    snprintf(p, sizeof p, "%s/tokenizer.json", ckpt);
    tu_write_ok(p, "{}", 2);
    cr_assert_eq(run_tokenizer_find(ckpt, ini, found, sizeof found), 0);
    cr_assert_str_eq(found, p);
    /* no train_file in the config */
    cr_assert_eq(run_tokenizer_find(NULL, "[model]\nn_layer = 2\n", found, sizeof found), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "no [data] train_file"), "%s", error_message());
}

Test(run_tokenizer, byte_progress_line)
{
    char line[256];
    byte_progress_format(line, sizeof line, "encoding", 5000000, 20000000, 2.0, 10);
    cr_assert_str_eq(line, "encoding [##........]  25%  5.0/20.0 MB  2.5 MB/s  eta 0m06s");
    byte_progress_format(line, sizeof line, "encoding", 0, 0, 0.0, 4);
    cr_assert_str_eq(line, "encoding [####] 100%  0.0/0.0 MB  0.0 MB/s  eta ?");
    /* off: nothing is written */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    struct byte_progress p;
    byte_progress_init(&p, f, 0, "x", 10);
    byte_progress_update(&p, 5);
    byte_progress_finish(&p, 10);
    fclose(f);
    cr_assert_eq(len, 0u);
    free(buf);
    f = open_memstream(&buf, &len);
    byte_progress_init(&p, f, 1, "x", 10);
    byte_progress_update(&p, 5);
    byte_progress_finish(&p, 10);
    fclose(f);
    cr_assert(strstr(buf, "\rx [") && strstr(buf, "100%") && buf[len - 1] == '\n', "%s", buf);
    free(buf);
}
