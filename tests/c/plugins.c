/* plugins: a program that loads libplugin.so (from its own directory)
 * with dlopen on command, for wpd's pending code events; libplugin2.so,
 * built from the same source, is a second module whose line table names
 * plugin.c; libplugin3.so, built from it too with its names renamed
 * (plugin3_work, plugin3_calls, plugin3_new), needs libplugin2.so: one
 * dlopen loads two modules whose line tables name plugin.c. All are opened
 * RTLD_NOW | RTLD_LOCAL, so each library's calls of plugin_work go to its
 * own (libplugin3.so defines no plugin_work: libplugin2.so's calls, its
 * constructor's included, bind to libplugin2.so's). Prints "READY pid=N",
 * then obeys one command per stdin line:
 *
 *   load        dlopen(libplugin.so) (its constructor calls plugin_work)
 *                                                        -> LOADED calls=<n>
 *   load2       dlopen(libplugin2.so) (its constructor calls its own
 *               plugin_work)                             -> LOADED2 calls=<n>
 *   load3       dlopen(libplugin3.so), which loads libplugin2.so with it
 *               (each constructor calls its own library's copy of the
 *               function, libplugin2.so's first)
 *                  -> LOADED3 calls=<libplugin3.so's> calls2=<libplugin2.so's>
 *   work T N    T threads each call plugin_work N times  -> WORKED n=<T*N>
 *   work2 T N   the same with libplugin2.so's plugin_work (after load2 or
 *               load3)                                    -> WORKED2 n=<T*N>
 *   work3 T N   the same with libplugin3.so's plugin3_work -> WORKED3 n=<T*N>
 *   new         o = plugin_new(1), then o->state = 0xdead by this program
 *               (the first store into the object)         -> NEW
 *   unload      dlclose                                   -> UNLOADED
 *   cycle N     N times dlopen then dlclose, timed        -> CYCLE ns=<total ns>
 *   exec        execs this program again (which prints READY again)
 *   quit        exits
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct pobj {
    long id;
    long state;
};

static void *plugin;
static long (*work)(long);
static struct pobj *(*make)(long);
static void *plugin2;
static long (*work2)(long);
static void *plugin3;
static long (*work3)(long);
static long (*thread_work)(long);
static long per_thread;

static void *worker(void *arg)
{
    long base = (long)arg;
    for (long i = 0; i < per_thread; i++)
        thread_work(base + i);
    return NULL;
}

/* T threads each call fn N times. */
static int run_workers(long (*fn)(long), long t_count, long n)
{
    pthread_t t[16];
    if (!fn || t_count < 1 || t_count > 16)
        return -1;
    thread_work = fn;
    per_thread = n;
    for (long i = 0; i < t_count; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i * 1000));
    for (long i = 0; i < t_count; i++)
        pthread_join(t[i], NULL);
    return 0;
}

static void lib_path(char *out, size_t n, const char *name)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0)
        len = 0;
    self[len] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(out, n, "%s/%s", self, name);
}

static void plugin_path(char *out, size_t n)
{
    lib_path(out, n, "libplugin.so");
}

int main(int argc, char **argv)
{
    (void)argc;
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("READY pid=%d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        long a = 0, b = 0;
        /* "load2", "load3", "work2" and "work3" first: "load" and
         * "work %ld %ld" match them too. */
        if (strncmp(line, "load3", 5) == 0) {
            char p[PATH_MAX + 32];
            lib_path(p, sizeof p, "libplugin3.so");
            plugin3 = dlopen(p, RTLD_NOW | RTLD_LOCAL);
            if (!plugin3) {
                printf("ERR dlopen %s\n", dlerror());
                continue;
            }
            work3 = (long (*)(long))dlsym(plugin3, "plugin3_work");
            /* Looked up from libplugin3.so: found in what it needs. */
            work2 = (long (*)(long))dlsym(plugin3, "plugin_work");
            long *calls = (long *)dlsym(plugin3, "plugin3_calls");
            long *calls2 = (long *)dlsym(plugin3, "plugin_calls");
            printf("LOADED3 calls=%ld calls2=%ld\n", calls ? *calls : -1,
                   calls2 ? *calls2 : -1);
        } else if (sscanf(line, "work3 %ld %ld", &a, &b) == 2) {
            if (run_workers(work3, a, b) != 0) {
                printf("ERR work3\n");
                continue;
            }
            printf("WORKED3 n=%ld\n", a * b);
        } else if (strncmp(line, "load2", 5) == 0) {
            char p[PATH_MAX + 32];
            lib_path(p, sizeof p, "libplugin2.so");
            plugin2 = dlopen(p, RTLD_NOW | RTLD_LOCAL);
            if (!plugin2) {
                printf("ERR dlopen %s\n", dlerror());
                continue;
            }
            work2 = (long (*)(long))dlsym(plugin2, "plugin_work");
            long *calls = (long *)dlsym(plugin2, "plugin_calls");
            printf("LOADED2 calls=%ld\n", calls ? *calls : -1);
        } else if (sscanf(line, "work2 %ld %ld", &a, &b) == 2) {
            if (run_workers(work2, a, b) != 0) {
                printf("ERR work2\n");
                continue;
            }
            printf("WORKED2 n=%ld\n", a * b);
        } else if (strncmp(line, "load", 4) == 0) {
            char p[PATH_MAX + 32];
            plugin_path(p, sizeof p);
            plugin = dlopen(p, RTLD_NOW);
            if (!plugin) {
                printf("ERR dlopen %s\n", dlerror());
                continue;
            }
            work = (long (*)(long))dlsym(plugin, "plugin_work");
            make = (struct pobj * (*)(long)) dlsym(plugin, "plugin_new");
            long *calls = (long *)dlsym(plugin, "plugin_calls");
            printf("LOADED calls=%ld\n", calls ? *calls : -1);
        } else if (sscanf(line, "work %ld %ld", &a, &b) == 2) {
            if (run_workers(work, a, b) != 0) {
                printf("ERR work\n");
                continue;
            }
            printf("WORKED n=%ld\n", a * b);
        } else if (strncmp(line, "new", 3) == 0) {
            if (!make) {
                printf("ERR new\n");
                continue;
            }
            struct pobj *o = make(1);
            o->state = 0xdead; /* LINE:plugin_first */
            free(o);
            printf("NEW\n");
        } else if (strncmp(line, "unload", 6) == 0) {
            if (!plugin || dlclose(plugin) != 0) {
                printf("ERR unload\n");
                continue;
            }
            plugin = NULL;
            work = NULL;
            make = NULL;
            printf("UNLOADED\n");
        } else if (sscanf(line, "cycle %ld", &a) == 1) {
            char p[PATH_MAX + 32];
            struct timespec t0, t1;
            plugin_path(p, sizeof p);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long i = 0; i < a; i++) {
                void *h = dlopen(p, RTLD_NOW);
                if (!h || dlclose(h) != 0)
                    break;
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("CYCLE ns=%ld\n",
                   (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
        } else if (strncmp(line, "exec", 4) == 0) {
            execv("/proc/self/exe", argv);
            printf("ERR exec\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        } else {
            printf("ERR unknown\n");
        }
    }
    return 0;
}
