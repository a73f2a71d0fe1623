/* libplugin.so: the plugin tests/c/plugins.c loads with dlopen on command,
 * for wpd's pending code events. Its constructor calls plugin_work once
 * (with -1), before dlopen returns; plugin_new hands out heap objects. */
#include <stdlib.h>

struct pobj {
    long id;
    long state;
};

long plugin_calls;
/* Not renamed in libplugin3.so: one name defined by each library. */
long plugin_shared;

__attribute__((noinline)) long plugin_work(long x)
{
    __atomic_add_fetch(&plugin_calls, 1, __ATOMIC_RELAXED); /* LINE:plugin_work */
    return x * 2;
}

__attribute__((noinline)) struct pobj *plugin_new(long id)
{
    struct pobj *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->id = id;
    return o;
}

__attribute__((constructor)) static void plugin_init(void)
{
    plugin_work(-1);
}
