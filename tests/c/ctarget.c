/* ctarget: the C program wpd's symbol tests watch by name.
 *
 * Built by tests/build.rs in several variants (with and without -g, PIE and
 * -no-pie, stripped with a separate debug file, stripped bare), linked with
 * libctlib.so, and able to dlopen libctplug.so. It prints one READY line with
 * its pid and the addresses of its variables (for the tests to compare with
 * what wpd resolves), then obeys one command per stdin line, answering each
 * with one line:
 *
 *   set NAME V      the main thread stores V into NAME (counter, initialized,
 *                   errors, flag2, name0, hidden, lib, plug, tls;
 *                   conn1state: conns->next->state, on the heap;
 *                   refs: g_item->refs, on the heap, through
 *                   touch_item(c, v))                                 -> SET
 *   spin N          N new threads store into `counter` in a loop, through
 *                   spin_worker -> bump_counter    -> SPINNING (once all run)
 *   refspin         a new thread stores into g_item->refs every ms, through
 *                   touch_item(c, v)                   -> REFSPINNING (once it runs)
 *   stop            the spinning threads end and are joined          -> STOPPED
 *   threads N       N more threads that wait, idle, until quit        -> THREADS n=<idle threads>
 *   deep            the main thread stores into `counter` 3 calls
 *                   deep (deep_a -> deep_b -> deep_c)                 -> DEEP
 *   dlopen          loads libctplug.so (from this program's dir)     -> DLOPENED plug=0x..
 *   dlclose         unloads it                                        -> DLCLOSED
 *   exec            executes itself again (same pid): a new READY
 *   pool PREFIX N   N threads naming themselves PREFIX-I once started, each storing into
 *                   `counter` every 2 ms                              -> POOL n=N tids=T1,T2,..
 *   pool-rename P   every pool thread renames itself P-I              -> POOL-RENAMED n=.. tids=..
 *   rename NAME     the main thread (the leader) renames itself        -> RENAMED
 *   rename-hex HEX  the same with any bytes (hex): a name holding a line
 *                   break or an escape sequence, as a hostile program's  -> RENAMED
 *   leader-exit     the main thread ends alone (pthread_exit): the process lives on
 *                   with a zombie leader, a new thread taking the commands
 *                                     -> LEADER-EXITED (once /proc shows the leader a zombie)
 *   quit            exits 0                                           -> BYE
 *
 * Every store the tests expect a hit from is on a line marked with a
 * `LINE:<tag>` comment, which the tests look up in this file to know the
 * line a hit must name. Nothing here is optimised away: -O0 everywhere but
 * the frame-pointer-less variant, and the stores go through volatile-free
 * but externally visible globals.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct stats {
    long hits;       /* offset 0 */
    int errors;      /* offset 8 */
    short flags[4];  /* offset 12 */
    char name[8];    /* offset 20 */
};                   /* 28 bytes, padded to 32 */

long counter;                      /* .bss */
int initialized = 7;               /* .data */
struct stats stats;                /* .bss, a struct */
static int hidden;                 /* a static: a local symbol */
__thread long tls_counter;         /* thread-local */
double big_table[64];              /* 512 bytes: more than 4 slots cover */
struct flex {
    long n;
    long items[];                  /* no bound: any index is in DWARF's range */
} flexobj;
static long twin = 1;              /* a static named as one in libctlib.so */
struct conn {
    int fd;                        /* offset 0 */
    int state;                     /* offset 4 */
    struct conn *next;             /* offset 8 */
};
struct conn *conns;                /* a list of 3 on the heap, made at start */
struct conn *no_conn;              /* NULL */
void *opaque;                      /* a void *: nothing to follow into */
enum mode { MODE_IDLE, MODE_RUN, MODE_DONE };
struct session {
    int id;                        /* offset 0 */
    enum mode mode;                /* offset 4 */
    unsigned int flags;            /* offset 8 */
    short grid[3][4];              /* offset 12 */
};
struct session g_sess = { 7, MODE_RUN, 0xfffffffeu, { { 0 } } };
typedef struct item {
    long key;                      /* offset 0 */
    int refs;                      /* offset 8 */
    unsigned short tag;            /* offset 12 */
} item_t;
item_t *g_item;                    /* one on the heap, made at start */
uint32_t g_version = 3;            /* a C library typedef in the DWARF */
/* Never used: -O2 (ct-nofp) leaves it out, DWARF keeps its name. */
static int left_out __attribute__((unused)) = 3;
void lib_set(long v);              /* libctlib.so's lib_counter: only through */
long *lib_addr(void);              /* these (no copy relocation into here) */
long lib_twin(void);

static atomic_int spinning;
static pthread_mutex_t idle_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle_cond = PTHREAD_COND_INITIALIZER;
static int nidle;
static pthread_t spinners[64];
static int nspin;
/* Spinners that have entered spin_worker: `spin` answers only once every
 * spinner counts itself here, so a test that stops them at once finds each
 * one inside spin_worker, not still in thread start-up. */
static atomic_int spinners_running;
static void *plug;

void touch_item(item_t *c, int v)
{
    c->refs = v; /* LINE:touch_item */
}

void bump_counter(long v)
{
    counter = v; /* LINE:bump_counter */
}

void set_errors(int v)
{
    stats.errors = v; /* LINE:set_errors */
}

void set_flag2(short v)
{
    stats.flags[2] = v; /* LINE:set_flag2 */
}

void deep_c(long v)
{
    counter = v; /* LINE:deep_c */
}

void deep_b(long v)
{
    deep_c(v + 1); /* LINE:deep_b */
}

void deep_a(long v)
{
    deep_b(v + 1); /* LINE:deep_a */
}

static void *spin_worker(void *arg)
{
    long v = (long)arg;
    atomic_fetch_add(&spinners_running, 1);
    while (atomic_load(&spinning)) {
        bump_counter(++v); /* LINE:spin_worker */
    }
    return NULL;
}

static void *refs_worker(void *arg)
{
    int v = 0;
    (void)arg;
    atomic_fetch_add(&spinners_running, 1);
    while (atomic_load(&spinning)) {
        touch_item(g_item, ++v); /* LINE:refs_worker */
        usleep(1000);
    }
    return NULL;
}

static void *idle_worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&idle_lock);
    for (;;)
        pthread_cond_wait(&idle_cond, &idle_lock);
    return NULL;
}

/* Named thread pools: each pool thread names itself PREFIX-I after it
 * starts (as pools do), then stores into `counter` every 2 ms; `pool-rename`
 * makes every pool thread rename itself. */
#define POOL_MAX 64
static pthread_t pool_threads[POOL_MAX];
static atomic_int pool_tids[POOL_MAX];
static atomic_int pool_named[POOL_MAX];
static int npool;
static char pool_prefix[32];
static atomic_int pool_generation;

static void *pool_worker(void *arg)
{
    long i = (long)arg;
    int seen = -1;
    atomic_store(&pool_tids[i], (int)syscall(SYS_gettid));
    for (;;) {
        int g = atomic_load(&pool_generation);
        if (g != seen) {
            char name[16];
            snprintf(name, sizeof name, "%.11s-%ld", pool_prefix, i % 100);
            prctl(PR_SET_NAME, name, 0, 0, 0);
            seen = g;
            atomic_store(&pool_named[i], g + 1);
        }
        counter = i; /* LINE:pool_worker */
        usleep(2000);
    }
    return NULL;
}

/* Waits until every pool thread has taken generation `g`'s name. */
static void pool_wait_named(int g)
{
    for (int tries = 0; tries < 5000; tries++) {
        int all = 1;
        for (int i = 0; i < npool; i++)
            if (atomic_load(&pool_named[i]) != g + 1)
                all = 0;
        if (all)
            return;
        usleep(1000);
    }
}

static void print_pool(const char *what, int from)
{
    printf("%s n=%d tids=", what, npool - from);
    for (int i = from; i < npool; i++)
        printf("%s%d", i > from ? "," : "", atomic_load(&pool_tids[i]));
    printf("\n");
}

static void ready(void)
{
    printf("READY pid=%d counter=%p initialized=%p stats=%p errors=%p flag2=%p hidden=%p "
           "lib=%p big=%p conn1state=%p sess=%p item=%p itemrefs=%p\n",
           getpid(), (void *)&counter, (void *)&initialized, (void *)&stats,
           (void *)&stats.errors, (void *)&stats.flags[2], (void *)&hidden,
           (void *)lib_addr(), (void *)big_table, (void *)&conns->next->state,
           (void *)&g_sess, (void *)g_item, (void *)&g_item->refs);
    fflush(stdout);
}

static void plug_path(char *out, size_t n)
{
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/thread-self/exe", self, sizeof self - 1);
    if (k < 0)
        k = 0;
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(out, n, "%s/libctplug.so", self);
}

static int set(const char *name, long v)
{
    if (!strcmp(name, "counter"))
        bump_counter(v);
    else if (!strcmp(name, "initialized"))
        initialized = (int)v; /* LINE:set_initialized */
    else if (!strcmp(name, "errors"))
        set_errors((int)v);
    else if (!strcmp(name, "flag2"))
        set_flag2((short)v);
    else if (!strcmp(name, "name0"))
        stats.name[0] = (char)v; /* LINE:set_name0 */
    else if (!strcmp(name, "hits"))
        stats.hits = v; /* LINE:set_hits */
    else if (!strcmp(name, "hidden"))
        hidden = (int)v; /* LINE:set_hidden */
    else if (!strcmp(name, "conn1state"))
        conns->next->state = (int)v; /* LINE:set_conn1state */
    else if (!strcmp(name, "refs"))
        touch_item(g_item, (int)v);
    else if (!strcmp(name, "tls"))
        tls_counter = v;
    else if (!strcmp(name, "twin"))
        twin = v + lib_twin();
    else if (!strcmp(name, "lib"))
        lib_set(v);
    else if (!strcmp(name, "plug")) {
        if (!plug)
            return -1;
        void (*f)(long) = (void (*)(long))dlsym(plug, "plug_set");
        if (!f)
            return -1;
        f(v);
    } else
        return -1;
    return 0;
}

/* The leader's pid, for the thread taking over the commands. */
static pid_t leader;
/* Set once main has set up: the thread taking over the commands enters
 * main again for its loop alone (main stays the caller of every command's
 * functions, as the tests' call chains expect). */
static int started;

int main(int argc, char **argv);

/* The commands after `leader-exit`: once the leader shows as a zombie. */
static void *commander(void *argv)
{
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", leader);
    for (;;) {
        FILE *f = fopen(path, "r");
        size_t k = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
        if (f)
            fclose(f);
        stat[k] = 0;
        char *end = strrchr(stat, ')');
        if (end && end[1] == ' ' && end[2] == 'Z')
            break;
        usleep(1000);
    }
    puts("LEADER-EXITED");
    exit(main(0, argv));
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!started) {
        started = 1;
        setvbuf(stdout, NULL, _IOLBF, 0);
        for (int i = 2; i >= 0; i--) {
            struct conn *c = calloc(1, sizeof *c);
            c->fd = 10 + i;
            c->next = conns;
            conns = c;
        }
        opaque = conns;
        g_item = calloc(1, sizeof *g_item);
        g_item->key = 42;
        g_item->refs = 2;
        g_item->tag = 9;
        leader = getpid();
        ready();
    }
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[64] = {0}, arg[128] = {0};
        long v = 0;
        int n = sscanf(line, "%63s %127s %li", cmd, arg, &v);
        if (n < 1)
            continue;
        if (!strcmp(cmd, "set") && n == 3) {
            if (set(arg, v) == 0)
                puts("SET");
            else
                printf("ERR unknown variable %s\n", arg);
        } else if (!strcmp(cmd, "spin") && n >= 2) {
            int k = atoi(arg);
            atomic_store(&spinning, 1);
            for (int i = 0; i < k && nspin < 64; i++)
                pthread_create(&spinners[nspin++], NULL, spin_worker, (void *)(long)(i * 1000000));
            while (atomic_load(&spinners_running) < nspin)
                usleep(200);
            puts("SPINNING");
        } else if (!strcmp(cmd, "refspin")) {
            atomic_store(&spinning, 1);
            if (nspin < 64)
                pthread_create(&spinners[nspin++], NULL, refs_worker, NULL);
            while (atomic_load(&spinners_running) < nspin)
                usleep(200);
            puts("REFSPINNING");
        } else if (!strcmp(cmd, "stop")) {
            atomic_store(&spinning, 0);
            for (int i = 0; i < nspin; i++)
                pthread_join(spinners[i], NULL);
            nspin = 0;
            atomic_store(&spinners_running, 0);
            puts("STOPPED");
        } else if (!strcmp(cmd, "threads") && n >= 2) {
            int k = atoi(arg);
            pthread_attr_t a;
            pthread_attr_init(&a);
            pthread_attr_setstacksize(&a, 64 * 1024);
            for (int i = 0; i < k; i++) {
                pthread_t t;
                if (pthread_create(&t, &a, idle_worker, NULL) != 0)
                    break;
                pthread_detach(t);
                nidle++;
            }
            pthread_attr_destroy(&a);
            printf("THREADS n=%d\n", nidle);
        } else if (!strcmp(cmd, "deep")) {
            deep_a(100);
            puts("DEEP");
        } else if (!strcmp(cmd, "dlopen")) {
            char p[PATH_MAX + 32];
            plug_path(p, sizeof p);
            plug = dlopen(p, RTLD_NOW);
            if (!plug) {
                printf("ERR dlopen %s: %s\n", p, dlerror());
                continue;
            }
            void *addr = dlsym(plug, "plug_counter");
            printf("DLOPENED plug=%p\n", addr);
        } else if (!strcmp(cmd, "dlclose")) {
            if (plug)
                dlclose(plug);
            plug = NULL;
            puts("DLCLOSED");
        } else if (!strcmp(cmd, "exec")) {
            fflush(stdout);
            execv("/proc/self/exe", argv);
            printf("ERR exec failed\n");
        } else if (!strcmp(cmd, "pool") && n == 3) {
            /* pool PREFIX N: N more pool threads, named PREFIX-I once started. */
            int from = npool;
            snprintf(pool_prefix, sizeof pool_prefix, "%.31s", arg);
            for (long k = 0; k < v && npool < POOL_MAX; k++) {
                long i = npool++;
                pthread_create(&pool_threads[i], NULL, pool_worker, (void *)i);
            }
            pool_wait_named(atomic_load(&pool_generation));
            print_pool("POOL", from);
        } else if (!strcmp(cmd, "pool-rename") && n >= 2) {
            /* Every pool thread renames itself PREFIX-I. */
            snprintf(pool_prefix, sizeof pool_prefix, "%.31s", arg);
            int g = atomic_fetch_add(&pool_generation, 1) + 1;
            pool_wait_named(g);
            print_pool("POOL-RENAMED", 0);
        } else if (!strcmp(cmd, "rename") && n >= 2) {
            /* The main thread's name (and so the process's, it is the leader). */
            if (prctl(PR_SET_NAME, arg, 0, 0, 0) == 0)
                puts("RENAMED");
            else
                printf("ERR prctl %s\n", arg);
        } else if (!strcmp(cmd, "rename-hex") && n >= 2) {
            char name[16] = {0};
            size_t len = strlen(arg) / 2;
            if (len > 15)
                len = 15;
            for (size_t i = 0; i < len; i++) {
                unsigned b = 0;
                sscanf(arg + 2 * i, "%2x", &b);
                name[i] = (char)b;
            }
            if (prctl(PR_SET_NAME, name, 0, 0, 0) == 0)
                puts("RENAMED");
            else
                printf("ERR prctl %s\n", arg);
        } else if (!strcmp(cmd, "leader-exit")) {
            pthread_t t;
            if (pthread_create(&t, NULL, commander, argv) != 0) {
                puts("ERR pthread_create");
                continue;
            }
            pthread_exit(NULL);
        } else if (!strcmp(cmd, "quit")) {
            puts("BYE");
            return 0;
        } else {
            printf("ERR unknown command %s\n", cmd);
        }
    }
    return 0;
}
