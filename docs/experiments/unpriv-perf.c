/*
 * Per-thread perf breakpoints opened by an unprivileged user on a process
 * of its own: rings and their memory-lock budget, sharing a ring between
 * threads (PERF_EVENT_IOC_SET_OUTPUT), inherited events, and what a hit
 * costs the writing thread (kernel-facts §25).
 *
 * Build and run (as root, dropping to nobody for the measurement; setpriv
 * execs the program, so it runs dumpable and with no capabilities, which
 * it prints):
 *
 *   gcc -O2 -pthread -Wall docs/experiments/unpriv-perf.c -o /tmp/unpriv-perf
 *   U="setpriv --reuid=65534 --regid=65534 --clear-groups"
 *   sh -c "ulimit -l 8192; $U /tmp/unpriv-perf rings 1300 1 2"
 *   sh -c "ulimit -l 64;   $U /tmp/unpriv-perf rings 1300 1 2"
 *   sh -c "ulimit -l 0;    $U /tmp/unpriv-perf rings 1300 1 2"
 *   sh -c "ulimit -l 0;    $U /tmp/unpriv-perf rings 1300 2 1"
 *   $U /tmp/unpriv-perf setoutput
 *   for n in 64 512; do for l in pertask percpu; do
 *     $U /tmp/unpriv-perf layout $l $n 20; done; done
 *   $U /tmp/unpriv-perf layout percpu 512 20 64
 *   for i in $(seq 17); do $U /tmp/unpriv-perf inherit 50 100; done
 *   $U /tmp/unpriv-perf cost 7 50000
 *
 * Every mode forks a target process (same user) whose threads are parked
 * on a futex in memory shared with the watcher (the parent); the watched
 * variable has the same address in both (fork without exec).
 *
 *   rings N P PROCS  first: may the user open a breakpoint on its own
 *                    thread, on a target thread, with exclude_kernel = 0,
 *                    with pid = -1. Then N parked threads; one breakpoint
 *                    per thread (pid = tid, cpu = -1) and a ring of 1 + P
 *                    pages each, until
 *                    perf_event_open or mmap fails. PROCS 2: a second
 *                    watcher process (forked, holding nothing: perf maps
 *                    are not copied at fork) then maps what it can.
 *   setoutput        errnos of PERF_EVENT_IOC_SET_OUTPUT between events of
 *                    two threads, of one thread, across CPUs, and from an
 *                    inherited event.
 *   layout L N W [P] N threads armed as L (pertask: one event and one 8 KiB
 *                    ring per thread; percpu: one event per thread per CPU,
 *                    pid = tid, cpu = c, all redirected into one ring of
 *                    1 + P pages per CPU, P 1 by default); fds, rings,
 *                    VmPin, time to arm; then each thread stores W times
 *                    and the samples are counted per thread.
 *   inherit K M      an inherit = 1 event (cpu = -1) on the target's main
 *                    thread, then K threads created later store M times
 *                    each: the event's count read while they live and
 *                    after they exit; its mmap; its PERF_EVENT_IOC_SET_OUTPUT
 *                    into the 1+64-page ring of a non-inherited event of
 *                    the main thread (never hit), whose samples are
 *                    counted; and one inherited event per CPU (pid = main,
 *                    cpu = c) with a 1+64-page ring each, samples counted.
 *   cost R N         the target's main thread stores N times per round,
 *                    R rounds of each case in turn: no breakpoint; a
 *                    breakpoint on it with its own 8 KiB ring drained by the
 *                    watcher (wakeup_events = 1); the same woken only when
 *                    half a page is written (watermark); ns per store.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXT 4096

volatile long watched __attribute__((aligned(64)));
volatile long other[8] __attribute__((aligned(64)));

struct shm {
	int phase;		/* futex */
	int nready;
	int ndone;
	int ntids;
	int nthreads, writes;
	double ns_per_write;
	int tids[MAXT];
};
static struct shm *S;
static long PG;

static long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void fwait(int *a, int v)
{
	int c;
	while ((c = __atomic_load_n(a, __ATOMIC_ACQUIRE)) < v)
		syscall(SYS_futex, a, FUTEX_WAIT, c, NULL, NULL, 0);
}

static void fset(int *a, int v)
{
	__atomic_store_n(a, v, __ATOMIC_RELEASE);
	syscall(SYS_futex, a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int peo(struct perf_event_attr *a, int pid, int cpu)
{
	return syscall(SYS_perf_event_open, a, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC);
}

static void bp_attr(struct perf_event_attr *a, void *addr)
{
	memset(a, 0, sizeof(*a));
	a->type = PERF_TYPE_BREAKPOINT;
	a->size = sizeof(*a);
	a->bp_type = HW_BREAKPOINT_W;
	a->bp_addr = (uintptr_t)addr;
	a->bp_len = HW_BREAKPOINT_LEN_8;
	a->sample_period = 1;
	a->sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
	a->wakeup_events = 1;
	a->exclude_kernel = 1;
	a->exclude_hv = 1;
}

static long status_kb(const char *key)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, strlen(key)))
			v = atol(line + strlen(key) + 1);
	if (f)
		fclose(f);
	return v;
}

static int prctl_dumpable(void)
{
	return prctl(PR_GET_DUMPABLE);
}

static void print_creds(void)
{
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");
	struct rlimit r;
	getrlimit(RLIMIT_MEMLOCK, &r);
	printf("uid %d euid %d", getuid(), geteuid());
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, "CapEff", 6) || !strncmp(line, "CapPrm", 6)) {
			line[strlen(line) - 1] = 0;
			printf(", %s", line);
		}
	if (f)
		fclose(f);
	printf(", RLIMIT_MEMLOCK %ld KiB, dumpable %d, online CPUs %ld\n",
	       r.rlim_cur == RLIM_INFINITY ? -1L : (long)(r.rlim_cur / 1024),
	       (int)prctl_dumpable(), sysconf(_SC_NPROCESSORS_ONLN));
}

/* ---- ring reading ---- */
struct ring {
	int fd;
	void *base;
	size_t len;
};
struct counts {
	long samples, lost, throttle, other, bad;
	int *seen;		/* optional: distinct tids of the samples */
	int nseen;
};

static int tid_index(int tid)
{
	for (int i = 0; i < S->ntids; i++)
		if (S->tids[i] == tid)
			return i;
	return -1;
}

static long *per_thread_samples;

static void note_tid(struct counts *c, int tid)
{
	for (int i = 0; i < c->nseen; i++)
		if (c->seen[i] == tid)
			return;
	if (c->nseen < MAXT)
		c->seen[c->nseen++] = tid;
}

static void drain(struct ring *r, struct counts *c)
{
	struct perf_event_mmap_page *m = r->base;
	unsigned char *data = (unsigned char *)r->base + PG;
	uint64_t size = r->len - PG;
	uint64_t head = __atomic_load_n(&m->data_head, __ATOMIC_ACQUIRE);
	uint64_t tail = m->data_tail;
	unsigned char buf[512];
	while (tail < head) {
		struct perf_event_header h;
		for (size_t i = 0; i < sizeof h; i++)
			((unsigned char *)&h)[i] = data[(tail + i) % size];
		if (h.size > sizeof buf || h.size < sizeof h ||
		    (h.type == PERF_RECORD_SAMPLE && h.size != 32)) {
			/* not a record this event writes: skip what is there */
			c->bad++;
			tail = head;
			break;
		}
		for (size_t i = 0; i < h.size; i++)
			buf[i] = data[(tail + i) % size];
		if (h.type == PERF_RECORD_SAMPLE) {
			c->samples++;
			uint32_t tid = *(uint32_t *)(buf + 8 + 8 + 4);
			int ix = tid_index(tid);
			if (per_thread_samples && ix >= 0)
				per_thread_samples[ix]++;
			if (c->seen)
				note_tid(c, tid);
		} else if (h.type == PERF_RECORD_LOST)
			c->lost += *(uint64_t *)(buf + 8 + 8);
		else if (h.type == PERF_RECORD_THROTTLE)
			c->throttle++;
		else
			c->other++;
		tail += h.size;
	}
	__atomic_store_n(&m->data_tail, tail, __ATOMIC_RELEASE);
}

/* ---- target ---- */
static int target_writes;

static void *parked(void *arg)
{
	long i = (long)arg;
	S->tids[i] = gettid();
	__atomic_add_fetch(&S->nready, 1, __ATOMIC_ACQ_REL);
	fwait(&S->phase, 1);
	for (int k = 0; k < target_writes; k++) {
		watched = k;
		if ((k & 3) == 3)
			sched_yield();
	}
	__atomic_add_fetch(&S->ndone, 1, __ATOMIC_ACQ_REL);
	fwait(&S->phase, 3);
	return NULL;
}

/* a target with n parked threads; they store `writes` times at phase 1 and
 * exit at phase 3; the main thread exits at phase 3 after joining them */
static pid_t spawn_parked(int n, int writes)
{
	S->nready = S->ndone = 0;
	S->phase = 0;
	S->ntids = n;
	pid_t p = fork();
	if (p == 0) {
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setstacksize(&at, 64 * 1024);
		pthread_t *th = calloc(n, sizeof *th);
		target_writes = writes;
		for (long i = 0; i < n; i++)
			if (pthread_create(&th[i], &at, parked, (void *)i)) {
				fprintf(stderr, "pthread_create %ld failed\n", i);
				_exit(2);
			}
		for (int i = 0; i < n; i++)
			pthread_join(th[i], NULL);
		_exit(0);
	}
	while (__atomic_load_n(&S->nready, __ATOMIC_ACQUIRE) < n)
		usleep(1000);
	return p;
}

static void end_target(pid_t p)
{
	fset(&S->phase, 3);
	int st;
	waitpid(p, &st, 0);
}


/* ---- rings ---- */
static int map_one(int fd, int pages, struct ring *r)
{
	r->fd = fd;
	r->len = (1 + pages) * PG;
	r->base = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return r->base == MAP_FAILED ? -errno : 0;
}

static int map_until_failure(const char *who, int from, int n, int pages)
{
	int mapped = 0, e = 0;
	const char *what = "none";
	for (int i = from; i < n; i++) {
		struct perf_event_attr a;
		bp_attr(&a, (void *)&watched);
		int fd = peo(&a, S->tids[i], -1);
		if (fd < 0) {
			e = errno;
			what = "perf_event_open";
			break;
		}
		struct ring r;
		int rc = map_one(fd, pages, &r);
		if (rc) {
			e = -rc;
			what = "mmap";
			close(fd);
			break;
		}
		mapped++;
	}
	printf("%s: %d rings of %d+%d pages mapped (%ld KiB); then %s failed: %s (%d); "
	       "VmPin %ld kB, VmLck %ld kB\n",
	       who, mapped, 1, pages, mapped * (1 + pages) * PG / 1024, what,
	       e ? strerror(e) : "-", e, status_kb("VmPin:"), status_kb("VmLck:"));
	return mapped;
}

static int cmd_rings(int n, int pages, int procs)
{
	struct rlimit r;
	getrlimit(RLIMIT_NOFILE, &r);
	r.rlim_cur = r.rlim_max;
	setrlimit(RLIMIT_NOFILE, &r);
	pid_t t = spawn_parked(n, 0);
	/* one's own thread, for comparison */
	struct perf_event_attr a;
	bp_attr(&a, (void *)&watched);
	int fd = peo(&a, gettid(), -1);
	printf("own thread: perf_event_open %s\n", fd >= 0 ? "ok" : strerror(errno));
	if (fd >= 0)
		close(fd);
	fd = peo(&a, S->tids[0], -1);
	printf("target thread (other process, same uid): perf_event_open %s\n",
	       fd >= 0 ? "ok" : strerror(errno));
	if (fd >= 0)
		close(fd);
	a.exclude_kernel = 0;
	fd = peo(&a, S->tids[0], -1);
	printf("same with exclude_kernel = 0: %s\n", fd >= 0 ? "ok" : strerror(errno));
	if (fd >= 0)
		close(fd);
	bp_attr(&a, (void *)&watched);
	fd = peo(&a, -1, 0);
	printf("pid = -1, cpu = 0: %s\n", fd >= 0 ? "ok" : strerror(errno));
	if (fd >= 0)
		close(fd);
	int m = map_until_failure("watcher 1", 0, n, pages);
	if (procs > 1) {
		pid_t w = fork();
		if (w == 0) {
			map_until_failure("watcher 2 (second process, same user, while 1 holds its rings)",
					  m, n, pages);
			_exit(0);
		}
		waitpid(w, NULL, 0);
	}
	end_target(t);
	return 0;
}

/* ---- set_output ---- */
static const char *res(int rc)
{
	static char b[8][64];
	static int k;
	k = (k + 1) % 8;
	snprintf(b[k], 64, "%s", rc == 0 ? "ok" : strerror(errno));
	return b[k];
}

static int cmd_setoutput(void)
{
	pid_t t = spawn_parked(2, 0);
	struct perf_event_attr a;
	struct ring r1, r2;
	int t1 = S->tids[0], t2 = S->tids[1];
	bp_attr(&a, (void *)&watched);
	int e1 = peo(&a, t1, -1), e2 = peo(&a, t2, -1);
	bp_attr(&a, (void *)&other[0]);
	int e1b = peo(&a, t1, -1);
	map_one(e1, 1, &r1);
	printf("thread 2 (cpu -1) -> ring of thread 1 (cpu -1): %s\n",
	       res(ioctl(e2, PERF_EVENT_IOC_SET_OUTPUT, e1)));
	printf("thread 1, second event (cpu -1) -> ring of thread 1 (cpu -1): %s\n",
	       res(ioctl(e1b, PERF_EVENT_IOC_SET_OUTPUT, e1)));
	bp_attr(&a, (void *)&watched);
	a.inherit = 1;
	int e1i = peo(&a, t1, -1);
	struct ring ri;
	int rc = map_one(e1i, 1, &ri);
	printf("inherit = 1, cpu -1, thread 1: open %s, mmap %s\n", e1i >= 0 ? "ok" : strerror(errno),
	       rc ? strerror(-rc) : "ok");
	printf("inherit = 1 (cpu -1) -> ring of thread 1 (cpu -1): %s\n",
	       res(ioctl(e1i, PERF_EVENT_IOC_SET_OUTPUT, e1)));
	/* per CPU */
	bp_attr(&a, (void *)&other[1]);
	int c0t1 = peo(&a, t1, 0), c1t1 = peo(&a, t1, 1), c0t2 = peo(&a, t2, 0), c1t2 = peo(&a, t2, 1);
	map_one(c0t1, 1, &r2);
	printf("thread 2 cpu 0 -> ring of thread 1 cpu 0: %s\n",
	       res(ioctl(c0t2, PERF_EVENT_IOC_SET_OUTPUT, c0t1)));
	printf("thread 2 cpu 1 -> ring of thread 1 cpu 0: %s\n",
	       res(ioctl(c1t2, PERF_EVENT_IOC_SET_OUTPUT, c0t1)));
	printf("thread 1 cpu 1 -> ring of thread 1 cpu 0: %s\n",
	       res(ioctl(c1t1, PERF_EVENT_IOC_SET_OUTPUT, c0t1)));
	printf("thread 2 cpu -1 -> ring of thread 1 cpu 0: %s\n",
	       res(ioctl(e2, PERF_EVENT_IOC_SET_OUTPUT, c0t1)));
	printf("thread 1 cpu 0 (mapped) -> ring of thread 1 cpu -1: %s\n",
	       res(ioctl(c0t1, PERF_EVENT_IOC_SET_OUTPUT, e1)));
	bp_attr(&a, (void *)&other[2]);
	a.inherit = 1;
	int i0 = peo(&a, t2, 0);
	printf("inherit = 1, thread 2 cpu 0 -> ring of thread 1 cpu 0: %s\n",
	       res(ioctl(i0, PERF_EVENT_IOC_SET_OUTPUT, c0t1)));
	end_target(t);
	return 0;
}

/* ---- layouts ---- */
static int cmd_layout(const char *layout, int n, int w, int pages)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	int ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	pid_t t = spawn_parked(n, w);
	per_thread_samples = calloc(n, sizeof(long));
	struct ring *rings = calloc(n + ncpu, sizeof *rings);
	int nrings = 0, nfds = 0;
	long t0 = now_ns();
	struct perf_event_attr a;
	bp_attr(&a, (void *)&watched);
	int percpu = !strcmp(layout, "percpu");
	int *lead = calloc(ncpu, sizeof(int));
	for (int i = 0; i < n; i++) {
		if (!percpu) {
			int fd = peo(&a, S->tids[i], -1);
			if (fd < 0) {
				printf("open %d: %s\n", i, strerror(errno));
				return 1;
			}
			nfds++;
			int rc = map_one(fd, 1, &rings[nrings]);
			if (rc) {
				printf("mmap %d: %s\n", i, strerror(-rc));
				return 1;
			}
			nrings++;
		} else
			for (int c = 0; c < ncpu; c++) {
				int fd = peo(&a, S->tids[i], c);
				if (fd < 0) {
					printf("open %d/%d: %s\n", i, c, strerror(errno));
					return 1;
				}
				nfds++;
				if (i == 0) {
					int rc = map_one(fd, pages, &rings[nrings]);
					if (rc) {
						printf("mmap cpu %d: %s\n", c, strerror(-rc));
						return 1;
					}
					lead[c] = fd;
					nrings++;
				} else if (ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, lead[c])) {
					printf("set_output %d/%d: %s\n", i, c, strerror(errno));
					return 1;
				}
			}
	}
	long t1 = now_ns();
	long charged = percpu ? nrings * (1 + pages) * PG / 1024 : nrings * 2 * PG / 1024;
	printf("%s %d threads: %d perf fds, %d rings (%ld KiB charged), VmPin %ld kB, armed in %.1f ms\n",
	       layout, n, nfds, nrings, charged, status_kb("VmPin:"), (t1 - t0) / 1e6);
	struct counts c = {0};
	fset(&S->phase, 1);
	long deadline = 0;
	for (;;) {
		for (int i = 0; i < nrings; i++)
			drain(&rings[i], &c);
		if (c.samples + c.lost >= (long)n * w)
			break;
		if (!deadline && __atomic_load_n(&S->ndone, __ATOMIC_ACQUIRE) == n)
			deadline = now_ns() + 500000000L;
		if (deadline && now_ns() > deadline)
			break;
		usleep(500);
	}
	int full = 0;
	for (int i = 0; i < n; i++)
		full += per_thread_samples[i] == w;
	printf("  stores %ld, samples %ld, lost %ld, throttle records %ld; threads with all %d samples: %d of %d\n",
	       (long)n * w, c.samples, c.lost, c.throttle, w, full, n);
	end_target(t);
	return 0;
}

/* ---- inherit ---- */
static void *inh_thread(void *arg)
{
	long m = (long)arg;
	for (long k = 0; k < m; k++)
		watched = k;
	__atomic_add_fetch(&S->ndone, 1, __ATOMIC_ACQ_REL);
	fwait(&S->phase, 3);
	return NULL;
}

static pid_t spawn_creator(int k, int m)
{
	S->phase = 0;
	S->ndone = 0;
	S->ntids = 0;
	pid_t p = fork();
	if (p == 0) {
		S->tids[0] = gettid();
		S->ntids = 1;
		fwait(&S->phase, 1);
		pthread_t th[MAXT];
		for (long i = 0; i < k; i++)
			pthread_create(&th[i], NULL, inh_thread, (void *)(long)m);
		for (int i = 0; i < k; i++)
			pthread_join(th[i], NULL);
		_exit(0);
	}
	while (!__atomic_load_n(&S->ntids, __ATOMIC_ACQUIRE))
		usleep(1000);
	return p;
}

struct rv {
	uint64_t value, enabled, running, id;
};

static int cmd_inherit(int k, int m)
{
	pid_t t = spawn_creator(k, m);
	struct perf_event_attr a;
	bp_attr(&a, (void *)&watched);
	a.inherit = 1;
	a.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID;
	int fd = peo(&a, t, -1);
	printf("inherit = 1, cpu -1, on the main thread: open %s\n", fd >= 0 ? "ok" : strerror(errno));
	struct ring r;
	int rc = map_one(fd, 1, &r);
	printf("  mmap: %s\n", rc ? strerror(-rc) : "ok");
	/* the inherited event redirected into the ring of a non-inherited
	 * event of the same thread (one that is never hit) */
	struct perf_event_attr ca;
	bp_attr(&ca, (void *)&other[5]);
	int carrier = peo(&ca, t, -1);
	struct ring cr;
	rc = map_one(carrier, 64, &cr);
	printf("  carrier event (cpu -1, not inherited, same thread), 1+64 pages: mmap %s; "
	       "SET_OUTPUT of the inherited event into it: %s\n",
	       rc ? strerror(-rc) : "ok", res(ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, carrier)));
	struct perf_event_attr g = a;
	g.read_format |= PERF_FORMAT_GROUP;
	g.bp_addr = (uintptr_t)&other[3];
	int gfd = peo(&g, t, -1);
	printf("  same with PERF_FORMAT_GROUP: open %s\n", gfd >= 0 ? "ok" : strerror(errno));
	g = a;
	g.sample_type |= PERF_SAMPLE_READ;
	g.bp_addr = (uintptr_t)&other[4];
	int sfd = peo(&g, t, -1);
	printf("  same with PERF_SAMPLE_READ: open %s\n", sfd >= 0 ? "ok" : strerror(errno));
	if (sfd >= 0)
		close(sfd);
	if (gfd >= 0)
		close(gfd);
	/* one inherited event per CPU on the main thread, each with a ring */
	int ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	struct ring pr[64];
	int pfd[64];
	bp_attr(&a, (void *)&watched);
	a.inherit = 1;
	for (int c = 0; c < ncpu; c++) {
		pfd[c] = peo(&a, t, c);
		rc = pfd[c] >= 0 ? map_one(pfd[c], 64, &pr[c]) : -errno;
		printf("inherit = 1, cpu %d, on the main thread, 1+64-page ring: %s\n", c,
		       rc ? strerror(-rc) : "ok");
	}
	fset(&S->phase, 1);
	struct counts c = {0}, cc1 = {0};
	c.seen = calloc(MAXT, sizeof(int));
	cc1.seen = calloc(MAXT, sizeof(int));
	while (__atomic_load_n(&S->ndone, __ATOMIC_ACQUIRE) < k) {
		usleep(1000);
		drain(&cr, &cc1);
		for (int i = 0; i < ncpu; i++)
			drain(&pr[i], &c);
	}
	drain(&cr, &cc1);
	struct rv v;
	read(fd, &v, sizeof v);
	printf("%d threads created after the open, %d stores each, threads alive: count %lu "
	       "(enabled %lu ns, running %lu ns)\n",
	       k, m, (unsigned long)v.value, (unsigned long)v.enabled, (unsigned long)v.running);
	fset(&S->phase, 3);
	int st;
	waitpid(t, &st, 0);
	read(fd, &v, sizeof v);
	printf("  after the threads exited: count %lu\n", (unsigned long)v.value);
	for (int i = 0; i < ncpu; i++)
		drain(&pr[i], &c);
	for (int i = 0; i < ncpu; i++) {
		uint64_t cnt = 0;
		read(pfd[i], &cnt, sizeof cnt);
		printf("  count of the inherited event on cpu %d: %lu\n", i, (unsigned long)cnt);
	}
	printf("  carrier ring (inherited cpu -1 event redirected): %ld samples from %d threads, "
	       "%ld lost, %ld throttle records, %ld unreadable headers (of %d stores by %d threads)\n",
	       cc1.samples, cc1.nseen, cc1.lost, cc1.throttle, cc1.bad, k * m, k);
	printf("  per-CPU inherited events' rings: %ld samples from %d threads, %ld lost, "
	       "%ld throttle records, %ld other records, %ld unreadable headers (of %d stores)\n",
	       c.samples, c.nseen, c.lost, c.throttle, c.other, c.bad, k * m);
	return 0;
}

/* ---- cost ---- */
static int cmpd(const void *a, const void *b)
{
	double x = *(double *)a, y = *(double *)b;
	return x < y ? -1 : x > y;
}

static int cmd_cost(int rounds, int n)
{
	S->phase = 0;
	S->ntids = 0;
	S->writes = n;
	pid_t t = fork();
	if (t == 0) {
		S->tids[0] = gettid();
		__atomic_store_n(&S->ntids, 1, __ATOMIC_RELEASE);
		for (int r = 1;; r += 2) {
			fwait(&S->phase, r);
			if (S->phase >= 1000)
				_exit(0);
			long t0 = now_ns();
			for (long i = 0; i < S->writes; i++)
				watched = i;
			S->ns_per_write = (double)(now_ns() - t0) / S->writes;
			fset(&S->phase, r + 1);
		}
	}
	while (!__atomic_load_n(&S->ntids, __ATOMIC_ACQUIRE))
		usleep(1000);
	double none[64], bp[64], bpw[64];
	long samples[64], lost[64], thr[64], samplesw[64], lostw[64];
	int ph = 0;
	for (int r = 0; r < rounds; r++)
		for (int mode = 0; mode < 3; mode++) {
			struct ring ring = {.fd = -1};
			struct counts c = {0};
			if (mode) {
				struct perf_event_attr a;
				bp_attr(&a, (void *)&watched);
				if (mode == 2) {
					/* wake the reader at half the ring, not at every sample */
					a.watermark = 1;
					a.wakeup_watermark = PG / 2;
				}
				int fd = peo(&a, t, -1);
				if (fd < 0 || map_one(fd, 1, &ring)) {
					perror("arm");
					return 1;
				}
			}
			fset(&S->phase, ++ph);
			while (__atomic_load_n(&S->phase, __ATOMIC_ACQUIRE) == ph) {
				if (mode) {
					struct pollfd p = {.fd = ring.fd, .events = POLLIN};
					poll(&p, 1, 10);
					drain(&ring, &c);
				} else
					usleep(1000);
			}
			ph++;
			if (mode) {
				drain(&ring, &c);
				munmap(ring.base, ring.len);
				close(ring.fd);
				if (mode == 1) {
					bp[r] = S->ns_per_write;
					samples[r] = c.samples;
					lost[r] = c.lost;
					thr[r] = c.throttle;
				} else {
					bpw[r] = S->ns_per_write;
					samplesw[r] = c.samples;
					lostw[r] = c.lost;
				}
			} else
				none[r] = S->ns_per_write;
		}
	fset(&S->phase, 1000);
	waitpid(t, NULL, 0);
	for (int r = 0; r < rounds; r++)
		printf("round %d: none %.2f ns, breakpoint %.1f ns (samples %ld, lost %ld, throttle records %ld "
		       "of %d stores), breakpoint woken at half ring %.1f ns (samples %ld, lost %ld)\n",
		       r, none[r], bp[r], samples[r], lost[r], thr[r], n, bpw[r], samplesw[r], lostw[r]);
	qsort(none, rounds, sizeof(double), cmpd);
	qsort(bp, rounds, sizeof(double), cmpd);
	qsort(bpw, rounds, sizeof(double), cmpd);
	printf("median (min-max) ns per store: none %.2f (%.2f-%.2f), breakpoint %.0f (%.0f-%.0f), "
	       "woken at half ring %.0f (%.0f-%.0f)\n",
	       none[rounds / 2], none[0], none[rounds - 1], bp[rounds / 2], bp[0], bp[rounds - 1],
	       bpw[rounds / 2], bpw[0], bpw[rounds - 1]);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	PG = sysconf(_SC_PAGESIZE);
	S = mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (argc < 2)
		goto usage;
	print_creds();
	if (!strcmp(argv[1], "rings") && argc == 5)
		return cmd_rings(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	if (!strcmp(argv[1], "setoutput"))
		return cmd_setoutput();
	if (!strcmp(argv[1], "layout") && (argc == 5 || argc == 6))
		return cmd_layout(argv[2], atoi(argv[3]), atoi(argv[4]), argc == 6 ? atoi(argv[5]) : 1);
	if (!strcmp(argv[1], "inherit") && argc == 4)
		return cmd_inherit(atoi(argv[2]), atoi(argv[3]));
	if (!strcmp(argv[1], "cost") && argc == 4)
		return cmd_cost(atoi(argv[2]), atoi(argv[3]));
usage:
	fprintf(stderr, "usage: see the comment at the top of the file\n");
	return 2;
}
