/* The NCCL backend's bootstrap step, exposed so it can be tested where no GPU exists. */
#ifndef FSDP_COMM_NCCL_H
#define FSDP_COMM_NCCL_H

struct store_client;

#define COMM_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

/* Rank 0 calls ncclGetUniqueId and publishes the id under "<key_prefix>/nccl_id"; the others wait up to
 * timeout_s for it. Every rank ends with the same id bytes. */
int comm_nccl_exchange_id(struct store_client *store, const char *key_prefix, int rank, double timeout_s,
                          unsigned char id[COMM_NCCL_ID_BYTES]);

#endif
