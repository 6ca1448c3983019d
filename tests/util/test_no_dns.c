/* The suite's DNS guard (no_dns.c) is in place in the plain build: names outside /etc/hosts are refused
 * without a query, numeric addresses and /etc/hosts names resolve, and the programs under test inherit
 * the guard (fsdp-launch given such a name says the guard refused it). */
#include "tests/util/launch_util.h"

#include <dlfcn.h>
#include <netdb.h>

static bool guard_loaded(void)
{
    Dl_info info;
    void *f = dlsym(RTLD_DEFAULT, "getaddrinfo");
    return f && dladdr(f, &info) && info.dli_fname && strstr(info.dli_fname, "no_dns");
}

Test(no_dns, names_outside_etc_hosts_are_refused)
{
    if (!guard_loaded())
        cr_skip_test("the DNS guard is not preloaded (sanitizer build: ASan's runtime must come first)");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    cr_assert_eq(getaddrinfo("fsdpc-no-such-host.invalid", "80", &hints, &res), EAI_NONAME);
    static const char *const ok[] = {"127.0.0.1", "::1", "localhost"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cr_assert_eq(getaddrinfo(ok[i], "80", &hints, &res), 0, "%s does not resolve", ok[i]);
        freeaddrinfo(res);
    }
}

Test(no_dns, programs_under_test_inherit_the_guard, .timeout = 30)
{
    if (!guard_loaded())
        cr_skip_test("the DNS guard is not preloaded (sanitizer build: ASan's runtime must come first)");
    char *dir = lu_tmpdir();
    const char *argv[] = {LU_LAUNCH, "--nnodes", "2", "--node_rank", "1", "--master_addr", "fsdpc-node0.invalid",
                          "--master_port", "29999", "--rdzv_timeout", "0.5", "/bin/true", NULL};
    pid_t p = lu_spawn(argv, dir, "launch", NULL);
    int code = lu_exit_code(lu_wait(p, 20));
    char *err = lu_slurp_tag(dir, "launch", "err");
    cr_assert_eq(code, 1, "exit %d:\n%s", code, err);
    cr_assert(strstr(err, "no_dns: refused to resolve 'fsdpc-node0.invalid'"), "%s", err);
    free(err);
    lu_rm_rf(dir);
    free(dir);
}
