/* The one monotonic clock of the programs, in seconds: deadlines, timeouts and durations. */
#ifndef FSDP_COMMON_CLOCK_H
#define FSDP_COMMON_CLOCK_H

/* Seconds on CLOCK_MONOTONIC: only differences mean something; a change of the wall clock never moves it,
 * so no deadline jumps when NTP corrects the time. */
double clock_now_s(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME): for records a person or another host reads, never for a
 * deadline. */
double clock_wall_s(void);

#endif
