/* common/rss.h: touching 64 MiB shows in the resident bytes and their peak; the reset brings the peak back
 * to what is resident once the memory is given back. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/rss.h"

#define MIB (1024u * 1024u)

Test(rss, touched_memory_is_resident_and_peaks)
{
    size_t before = rss_now();
    cr_assert_gt(before, 0, "no VmRSS in /proc/self/status");
    size_t bytes = 64 * MIB;
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    memset(p, 1, bytes);
    size_t during = rss_now();
    cr_expect_geq(during, before + 48 * MIB, "64 MiB touched: %zu -> %zu bytes resident", before, during);
    cr_expect_geq(rss_peak(), during, "the peak is at least what is resident");
    munmap(p, bytes);
    size_t after = rss_peak_reset();
    cr_expect_lt(after, during - 32 * MIB, "given back: %zu bytes resident, %zu before", after, during);
    /* Kernels that refuse clear_refs keep the process's peak: only then is it still the 64 MiB one. */
    size_t peak = rss_peak();
    cr_expect_geq(peak, after);
}

Test(rss, status_fields_of_this_and_another_process)
{
    long self = rss_status_kib(0, "VmRSS");
    cr_assert_gt(self, 0, "no VmRSS in /proc/self/status");
    cr_expect_eq(rss_status_kib(0, "NoSuchField"), -1);
    cr_expect_geq(rss_status_kib(0, "RssShmem"), 0, "RssShmem is a field of every process's status");
    long by_pid = rss_status_kib((int)getpid(), "VmRSS");
    cr_expect(by_pid > self / 2 && by_pid < self * 2, "VmRSS by pid %ld KiB, by self %ld KiB", by_pid, self);
    cr_expect_eq(rss_status_kib(0x7ffffffe, "VmRSS"), -1, "a pid that does not exist");
}
