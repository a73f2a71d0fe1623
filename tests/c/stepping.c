/* The program the stepping tests drive (tests/e2e/step.rs,
 * tests/dap/step.test.mjs, wpd-bench's `steps`): a thread named `stepper`
 * loops over a chain of calls whose lines are marked LINE:<tag> (a
 * recursion, a call into the C library, a store into `watched`), while
 * argv[1] worker threads (4 by default) run, writing `hot` while `heat` is
 * set; with argv[2] "handoff", the loop also waits each time until a
 * worker answers it (`handoff`: a step over it ends only if the others
 * run). `pace` is what setVariable changes (tests/dap/setvar.test.mjs): its
 * `add` makes `i`, hence `loops`, jump. Built at -O0 (ct-step) and -O2
 * (ct-step-o2). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile long watched;
volatile long hot;
volatile int heat;
volatile long spins;
volatile long loops;
volatile int ask;
volatile int answered;
volatile int handoff_on;

__attribute__((noinline)) long leaf(long x)
{
    long y = x * 3; /* LINE:leaf_first */
    watched = y; /* LINE:leaf_store */
    return y + 1; /* LINE:leaf_ret */
}

__attribute__((noinline)) long fact(long n)
{
    if (n <= 1) /* LINE:fact_test */
        return 1;
    return n * fact(n - 1); /* LINE:fact_rec */
}

__attribute__((noinline)) long middle(long x)
{
    long a = leaf(x); /* LINE:middle_call */
    long n = (long)getpid() & 1; /* LINE:middle_libc */
    return a + n + fact(4); /* LINE:middle_ret */
}

__attribute__((noinline)) void slow(void)
{
    usleep(300 * 1000); /* LINE:slow_sleep */
}

/* Waits until a worker has seen `ask`. */
__attribute__((noinline)) void handoff(void)
{
    ask = 1; /* LINE:handoff_ask */
    while (!answered) { /* LINE:handoff_wait */ }
    answered = 0; /* LINE:handoff_done */
}

__attribute__((noinline)) void step_here(long i)
{
    loops = i; /* LINE:step_here */
}

/* How the stepper's loop goes on. */
struct pace {
    long add; /* added to i each loop, besides 1 or 2 */
    int sleep_us; /* the loop's sleep */
};

static void *stepper(void *arg)
{
    (void)arg;
    long i = 0;
    struct pace pace = { 0, 1000 };
    for (;;) { /* LINE:loop_for */
        step_here(i); /* LINE:loop_top */
        long r = middle(i); /* LINE:loop_call */
        if (heat) /* LINE:loop_heat */
            slow(); /* LINE:loop_slow */
        i += pace.add + ((r & 1) ? 1 : 2); /* LINE:loop_next */
        if (handoff_on) /* LINE:loop_handoff_if */
            handoff(); /* LINE:loop_handoff */
        usleep(pace.sleep_us); /* LINE:loop_sleep */
    }
    return NULL;
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        spins++;
        if (heat)
            hot++;
        if (ask) {
            ask = 0;
            answered = 1;
        }
        usleep(2000);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    handoff_on = argc > 2 && strcmp(argv[2], "handoff") == 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 * 1024);
    pthread_t t;
    for (int k = 0; k < n; k++) {
        if (pthread_create(&t, &a, worker, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    pthread_create(&t, &a, stepper, NULL);
    pthread_setname_np(t, "stepper");
    printf("ready %d\n", n);
    fflush(stdout);
    for (;;)
        pause();
}
