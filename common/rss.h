/* This process's resident memory (RSS) as the kernel counts it (/proc/self/status): what a rank reports in
 * its metrics and status records, and what a checkpoint save costs. */
#ifndef FSDP_COMMON_RSS_H
#define FSDP_COMMON_RSS_H

#include <stddef.h>

/* Resident bytes now (VmRSS); 0 where /proc cannot be read. */
size_t rss_now(void);
/* The peak of resident bytes (VmHWM) since the process started or since the last rss_peak_reset; 0 where
 * /proc cannot be read. */
size_t rss_peak(void);
/* Resets the peak mark to what is resident now, so that a later rss_peak measures what follows (a save, a
 * step), and returns rss_now(). Where the kernel refuses the reset the peak stays the process's. */
size_t rss_peak_reset(void);
/* The "FIELD:   N kB" figure of /proc/<pid>/status in KiB (pid 0: this process), for the memory of another
 * process or a field the functions above do not give (RssShmem); -1 where the file cannot be read or has no
 * such field. */
long rss_status_kib(int pid, const char *field);

#endif
