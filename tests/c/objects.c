/* objects: heap objects born in a function, for wpd's code-event tests.
 *
 * Built by tests/build.rs with -g (ct-objects) and without (ct-objects-nodebug).
 * Prints "READY pid=N", then obeys one command per stdin line, answering
 * each with one line:
 *
 *   run T N     T threads each create N objects with conn_new, update their
 *               state legitimately through conn_set_state, take a reference
 *               (conn_ref) and free them (conn_free)                -> RAN n=T*N
 *   corrupt     one object created, updated, then corrupted by
 *               conn_corrupt (state = 0xdead) and freed              -> CORRUPTED
 *   first       one object created, its state written by the caller
 *               right after conn_new returns (state = 0xdead)         -> FIRST
 *   keep N      N objects created and kept (never freed)             -> KEPT n=N
 *   rate N      conn_new + conn_free N times, timed                   -> RATE ns=<total ns>
 *   pace N US   N objects, one every US µs: conn_new, then conn_free (the
 *               object never written), each call timed       -> PACE new_ns=<mean>
 *               free_ns=<mean> wall_ns=<total>
 *   afterfree N N objects, each with its state written once while live
 *               (state = 5), then freed, then written again through the
 *               dangling pointer (state = 0xdead): the voluntary context
 *               switches of the thread over the loop (a stop of the thread
 *               by its tracer is one)                         -> AFTERFREE csw=<n>
 *   sleepers T  T more threads that only sleep until the process exits
 *               (they create no object, but hold slots of
 *               process-wide watchpoints)                         -> SLEEPING n=T
 *   writers T   T more threads (at most 8) that wait for objects handed
 *               to them                                           -> WRITERS n=T
 *   handoff K   one object created by the main thread, handed to writer
 *               K, which stores into its state (state = 0xdead), then
 *               freed by the main thread           -> HANDOFF tid=<writer's tid>
 *   quit        exits
 *
 * `objects pace N US` runs the pace command alone and exits (under gdb).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct conn {
    long id;
    long state;
    long refs;
    char pad[40];
};

__attribute__((noinline)) struct conn *conn_new(long id)
{
    struct conn *c = malloc(sizeof *c); /* LINE:new_body */
    if (!c)
        abort();
    memset(c, 0, sizeof *c);
    c->id = id;
    return c;
}

__attribute__((noinline)) void conn_set_state(struct conn *c, long state)
{
    c->state = state; /* LINE:set_state */
}

__attribute__((noinline)) void conn_ref(struct conn *c)
{
    c->refs++; /* LINE:ref */
}

__attribute__((noinline)) void conn_corrupt(struct conn *c)
{
    c->state = 0xdead; /* LINE:corrupt */
}

__attribute__((noinline)) void conn_free(struct conn *c)
{
    free(c);
}

static long per_thread;

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* N objects, one every `us` µs (absolute ticks, so a slow call does not
 * push the rest back): the mean time in conn_new and in conn_free. */
static void pace(long n, long us)
{
    long new_ns = 0, free_ns = 0, start = now_ns();
    for (long i = 0; i < n; i++) {
        long tick = start + i * us * 1000;
        long now = now_ns();
        if (tick > now) {
            struct timespec d = {(tick - now) / 1000000000L, (tick - now) % 1000000000L};
            nanosleep(&d, NULL);
        }
        long t0 = now_ns();
        struct conn *c = conn_new(i);
        long t1 = now_ns();
        conn_free(c);
        long t2 = now_ns();
        new_ns += t1 - t0;
        free_ns += t2 - t1;
    }
    printf("PACE new_ns=%ld free_ns=%ld wall_ns=%ld\n", new_ns / n, free_ns / n,
           now_ns() - start);
}

static void *sleeper(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

/* Writers: each waits for an object in its slot, stores into it, and
 * gives the slot back empty. */
#define MAX_WRITERS 8
static pthread_mutex_t hand_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hand_cond = PTHREAD_COND_INITIALIZER;
static struct conn *handed[MAX_WRITERS];
static pid_t writer_tid[MAX_WRITERS];
static long writers;

static void *writer(void *arg)
{
    long k = (long)arg;
    pthread_mutex_lock(&hand_lock);
    writer_tid[k] = gettid();
    pthread_cond_broadcast(&hand_cond);
    for (;;) {
        while (!handed[k])
            pthread_cond_wait(&hand_cond, &hand_lock);
        handed[k]->state = 0xdead; /* LINE:handoff */
        handed[k] = NULL;
        pthread_cond_broadcast(&hand_cond);
    }
    return NULL;
}

static void *worker(void *arg)
{
    long base = (long)arg;
    for (long i = 0; i < per_thread; i++) {
        struct conn *c = conn_new(base + i);
        conn_set_state(c, 1);
        conn_ref(c);
        conn_set_state(c, 2);
        conn_set_state(c, 3);
        conn_free(c);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "pace") == 0) {
        pace(atol(argv[2]), atol(argv[3]));
        return 0;
    }
    printf("READY pid=%d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        long a = 0, b = 0;
        if (sscanf(line, "run %ld %ld", &a, &b) == 2) {
            pthread_t t[64];
            if (a < 1 || a > 64) {
                printf("ERR threads\n");
                continue;
            }
            per_thread = b;
            for (long i = 0; i < a; i++)
                pthread_create(&t[i], NULL, worker, (void *)(i * 1000000));
            for (long i = 0; i < a; i++)
                pthread_join(t[i], NULL);
            printf("RAN n=%ld\n", a * b);
        } else if (strncmp(line, "corrupt", 7) == 0) {
            struct conn *c = conn_new(7);
            conn_set_state(c, 1);
            conn_corrupt(c);
            conn_free(c);
            printf("CORRUPTED\n");
        } else if (strncmp(line, "first", 5) == 0) {
            struct conn *c = conn_new(8);
            c->state = 0xdead; /* LINE:first */
            conn_free(c);
            printf("FIRST\n");
        } else if (sscanf(line, "keep %ld", &a) == 1) {
            for (long i = 0; i < a; i++)
                conn_set_state(conn_new(i), 1);
            printf("KEPT n=%ld\n", a);
        } else if (sscanf(line, "pace %ld %ld", &a, &b) == 2) {
            pace(a, b);
        } else if (sscanf(line, "rate %ld", &a) == 1) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long i = 0; i < a; i++) {
                struct conn *c = conn_new(i);
                c->state = 1;
                conn_free(c);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("RATE ns=%ld\n",
                   (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
        } else if (sscanf(line, "afterfree %ld", &a) == 1) {
            struct rusage r0, r1;
            getrusage(RUSAGE_THREAD, &r0);
            for (long i = 0; i < a; i++) {
                struct conn *c = conn_new(i);
                c->state = 5; /* LINE:live */
                struct conn *volatile dangling = c;
                conn_free(c);
                dangling->state = 0xdead; /* LINE:afterfree */
            }
            getrusage(RUSAGE_THREAD, &r1);
            printf("AFTERFREE csw=%ld\n", r1.ru_nvcsw - r0.ru_nvcsw);
        } else if (sscanf(line, "sleepers %ld", &a) == 1) {
            for (long i = 0; i < a; i++) {
                pthread_t t;
                pthread_create(&t, NULL, sleeper, NULL);
                pthread_detach(t);
            }
            printf("SLEEPING n=%ld\n", a);
        } else if (sscanf(line, "writers %ld", &a) == 1) {
            if (a < 1 || writers + a > MAX_WRITERS) {
                printf("ERR writers\n");
                continue;
            }
            for (long i = 0; i < a; i++) {
                pthread_t t;
                pthread_create(&t, NULL, writer, (void *)writers);
                pthread_detach(t);
                pthread_mutex_lock(&hand_lock);
                while (!writer_tid[writers])
                    pthread_cond_wait(&hand_cond, &hand_lock);
                pthread_mutex_unlock(&hand_lock);
                writers++;
            }
            printf("WRITERS n=%ld\n", a);
        } else if (sscanf(line, "handoff %ld", &a) == 1) {
            if (a < 0 || a >= writers) {
                printf("ERR writer\n");
                continue;
            }
            struct conn *c = conn_new(9);
            pthread_mutex_lock(&hand_lock);
            handed[a] = c;
            pthread_cond_broadcast(&hand_cond);
            while (handed[a])
                pthread_cond_wait(&hand_cond, &hand_lock);
            pthread_mutex_unlock(&hand_lock);
            conn_free(c);
            printf("HANDOFF tid=%d\n", (int)writer_tid[a]);
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        } else {
            printf("ERR unknown\n");
        }
    }
    return 0;
}
