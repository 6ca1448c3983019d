/* Small file-system helpers shared by the programs. */
#ifndef FSDP_COMMON_FS_H
#define FSDP_COMMON_FS_H

/* Creates dir and its missing parents (like mkdir -p; existing ones are fine). what names the directory's
 * role in the error ("log directory", "checkpoint.dir"), which says the path and the cause. */
int fs_mkdir_p(const char *dir, const char *what);

#endif
