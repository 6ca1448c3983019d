#include "tests/util/tu_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *tu_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    while (s) {
        if (n + 4096 + 1 > cap) {
            char *t = realloc(s, cap *= 2);
            if (!t) {
                free(s);
                s = NULL;
                break;
            }
            s = t;
        }
        size_t r = fread(s + n, 1, 4096, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    if (s)
        s[n] = 0;
    return s;
}

int tu_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}
