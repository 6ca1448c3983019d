/* The process-wide registry of comm_mem_alloc buffers of the cpu backend.
 *
 * A memfd per allocation rather than one named /dev/shm file: a memfd has no name, so nothing can be
 * left behind when the process is killed, and a peer still opens it by /proc/<pid>/fd/<fd> for as long
 * as the owner keeps it (the peer's own mapping then keeps the pages alive even if the owner dies while
 * the peer reads). The fd stays open until the buffer is freed for exactly that reason. */
#include "comm/comm_mem.h"
#include "common/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct mem_entry {
    unsigned char *base;
    size_t bytes;
    int fd;
    uint64_t id;
};

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mem_entry *mem_tab;
static size_t mem_n, mem_cap;
static uint64_t mem_next_id = 1, mem_frees;

void *comm_mem_shared_alloc(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = bytes ? (bytes + page - 1) / page * page : page;
    if (len < bytes) {
        error_set(FSDP_EINVAL, "comm_mem_alloc: %zu bytes is too large", bytes);
        return NULL;
    }
    int fd = memfd_create("fsdp-comm-mem", MFD_CLOEXEC);
    if (fd < 0) {
        error_set(FSDP_EIO, "comm_mem_alloc: memfd_create failed: %s", strerror(errno));
        return NULL;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        error_set(FSDP_ENOMEM, "comm_mem_alloc: cannot size a %zu-byte buffer: %s", len, strerror(e));
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        error_set(FSDP_ENOMEM, "comm_mem_alloc: mmap of %zu bytes failed: %s", len, strerror(e));
        return NULL;
    }
    pthread_mutex_lock(&mem_mu);
    if (mem_n == mem_cap) {
        size_t cap = mem_cap ? 2 * mem_cap : 16;
        struct mem_entry *t = realloc(mem_tab, cap * sizeof(*t));
        if (!t) {
            pthread_mutex_unlock(&mem_mu);
            munmap(p, len);
            close(fd);
            error_set(FSDP_ENOMEM, "comm_mem_alloc: out of memory");
            return NULL;
        }
        mem_tab = t;
        mem_cap = cap;
    }
    mem_tab[mem_n++] = (struct mem_entry){.base = p, .bytes = len, .fd = fd, .id = mem_next_id++};
    pthread_mutex_unlock(&mem_mu);
    return p;
}

int comm_mem_shared_free(void *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&mem_mu);
    for (size_t i = 0; i < mem_n; i++) {
        if (mem_tab[i].base != p)
            continue;
        struct mem_entry e = mem_tab[i];
        mem_tab[i] = mem_tab[--mem_n];
        mem_frees++;
        pthread_mutex_unlock(&mem_mu);
        munmap(e.base, e.bytes);
        close(e.fd);
        return 0;
    }
    pthread_mutex_unlock(&mem_mu);
    return error_set(FSDP_EINVAL, "comm_mem_free: %p was not allocated by comm_mem_alloc (or freed twice)", p);
}

bool comm_mem_lookup(const void *p, size_t bytes, struct comm_mem_ref *ref)
{
    const unsigned char *q = p;
    bool found = false;
    pthread_mutex_lock(&mem_mu);
    for (size_t i = 0; i < mem_n && !found; i++) {
        const struct mem_entry *e = &mem_tab[i];
        if (q >= e->base && q < e->base + e->bytes && bytes <= (size_t)(e->base + e->bytes - q)) {
            *ref = (struct comm_mem_ref){.fd = e->fd, .id = e->id, .map_bytes = e->bytes,
                                         .off = (uint64_t)(q - e->base)};
            found = true;
        }
    }
    pthread_mutex_unlock(&mem_mu);
    return found;
}

uint64_t comm_mem_free_count(void)
{
    pthread_mutex_lock(&mem_mu);
    uint64_t n = mem_frees;
    pthread_mutex_unlock(&mem_mu);
    return n;
}
