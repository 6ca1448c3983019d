/* Preloaded into fsdp-prepare-data by test_prepare_data's growth test: the first time the program reads the
 * file FSDP_TEST_GROW_FILE names, after it opened it and before its first read returns, the bytes of the
 * file FSDP_TEST_GROW_WITH are appended to it, as a writer appending while the file is read would. Without
 * this the test would race a real writer against a read that takes microseconds. read() and fread() are both
 * caught, so how the program reads does not matter; the file is recognised by device and inode. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static bool fired;

static ssize_t real_read(int fd, void *buf, size_t n)
{
    static ssize_t (*fn)(int, void *, size_t);
    if (!fn)
        fn = (ssize_t(*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    return fn(fd, buf, n);
}

static void grow_if_target(int fd)
{
    const char *target = getenv("FSDP_TEST_GROW_FILE"), *with = getenv("FSDP_TEST_GROW_WITH");
    struct stat a, b;
    if (fired || !target || !with || fstat(fd, &a) != 0 || stat(target, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino)
        return;
    fired = true;
    int in = open(with, O_RDONLY | O_CLOEXEC), out = open(target, O_WRONLY | O_APPEND | O_CLOEXEC);
    char buf[65536];
    ssize_t k;
    while (in >= 0 && out >= 0 && (k = real_read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)k) != k)
            break;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
}

ssize_t read(int fd, void *buf, size_t n)
{
    grow_if_target(fd);
    return real_read(fd, buf, n);
}

size_t fread(void *ptr, size_t size, size_t n, FILE *f)
{
    static size_t (*fn)(void *, size_t, size_t, FILE *);
    if (!fn)
        fn = (size_t(*)(void *, size_t, size_t, FILE *))dlsym(RTLD_NEXT, "fread");
    grow_if_target(fileno(f));
    return fn(ptr, size, n, f);
}
