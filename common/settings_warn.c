/* Reads of settings for places that cannot fail: a value the entry does not allow gives the default, after
 * one warning per process and setting (a communicator reads its settings each time one is created). */
#include "common/settings.h"

#include <stdatomic.h>

#include "common/error.h"
#include "common/log.h"

static atomic_bool warned[SETTING_COUNT];

static void warn_once(enum setting_id id)
{
    const struct setting *s = settings_entry(id);
    if (!s || atomic_exchange(&warned[id], true))
        return;
    if (s->def)
        log_warn("%s; using the default, %s", error_message(), s->def);
    else
        log_warn("%s; ignoring it", error_message());
}

bool settings_bool(enum setting_id id)
{
    bool v = false;
    if (settings_get_bool(id, &v) != 0)
        warn_once(id);
    return v;
}

long settings_int(enum setting_id id)
{
    long v = 0;
    if (settings_get_int(id, &v) != 0)
        warn_once(id);
    return v;
}

double settings_double(enum setting_id id)
{
    double v = 0;
    if (settings_get_double(id, &v) != 0)
        warn_once(id);
    return v;
}

int settings_enum(enum setting_id id)
{
    int v = 0;
    if (settings_get_enum(id, &v) != 0)
        warn_once(id);
    return v;
}
