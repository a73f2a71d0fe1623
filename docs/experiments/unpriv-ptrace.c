/*
 * New threads of one's own process, without privilege: arming them at
 * ptrace's clone stops, what a watcher's SIGKILL leaves behind, and
 * finding them by polling /proc instead (kernel-facts §25).
 *
 * Build and run (as root, dropping to nobody; setpriv execs the program,
 * so it runs dumpable and with no capabilities):
 *
 *   gcc -O2 -pthread -Wall docs/experiments/unpriv-ptrace.c -o /tmp/unpriv-ptrace
 *   U="setpriv --reuid=65534 --regid=65534 --clear-groups"
 *   for m in none ptrace traced; do $U /tmp/unpriv-ptrace clone $m 2000; done
 *   $U /tmp/unpriv-ptrace kill perf 20
 *   $U /tmp/unpriv-ptrace kill dr7 20
 *   for i in 1000 10000; do for l in 1000 10000; do
 *     $U /tmp/unpriv-ptrace poll $i $l 300 2000; done; done
 *   $U /tmp/unpriv-ptrace poll 1000 300000 200 5000
 *   $U /tmp/unpriv-ptrace poll 10000 300000 200 5000
 *
 * The program forks a target process and a watcher process (both the
 * same user; the watcher is not the target's parent nor its ancestor);
 * they share one anonymous shared mapping, and the watched variable has
 * the same address in both.
 *
 *   clone M N   the target's main thread creates and joins a thread N
 *               times (the thread stores the watched variable once), then
 *               4 threads store it 25,000 times each. M none: no watcher;
 *               ptrace: the watcher seizes the target with
 *               PTRACE_O_TRACECLONE and resumes each clone stop at once;
 *               traced: the same, and at each clone stop it opens the new
 *               thread's breakpoint (pid = tid, cpu = -1, 8 KiB ring)
 *               before resuming it. Prints p50/p99 of create+join, the
 *               watcher's stops by kind, the samples in the rings.
 *   kill K R    R rounds: 16 threads store every 200 us, one thread
 *               creates and joins short threads (each stores 5 times);
 *               the watcher seizes every thread and arms them (K perf:
 *               per-thread perf breakpoints with their rings, new threads
 *               at clone stops; K dr7: DR0/DR7 written with
 *               PTRACE_POKEUSER, each SIGTRAP stop resumed without the
 *               signal), then is SIGKILLed 20-300 ms after it is armed.
 *               200 ms later: is the target alive, are threads stopped
 *               (/proc/PID/task/TID/stat), do the writers progress, and
 *               do 4 fresh perf breakpoints open on every thread.
 *   poll I L C S  the target creates C threads, one every 0-2S us
 *               (uniform), each living L us; the watcher (no ptrace)
 *               lists /proc/PID/task every I us and opens a breakpoint
 *               (with its 8 KiB ring) for each new tid. Prints the
 *               fraction of threads armed and the delay from a thread's
 *               first instruction to its breakpoint, p50/p99.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXT 8192

volatile long watched __attribute__((aligned(64)));
volatile long spare[8] __attribute__((aligned(64)));

struct shm {
	int phase;		/* futex */
	int armed;
	int writing;		/* 1 while the 4 writers store, 2 after */
	int stop;		/* target: stop creating */
	int clonedone;		/* the create+join loop is over */
	long counter[32];	/* per writer */
	long created;
	long hits;		/* watcher's count of hits so far */
	int ntid;
	int tid[MAXT];
	long start_ns[MAXT];
	double lat_us[4096];
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

static int cmpd(const void *a, const void *b)
{
	double x = *(double *)a, y = *(double *)b;
	return x < y ? -1 : x > y;
}

/* ---- perf ---- */
static void bp_attr(struct perf_event_attr *a, volatile void *addr)
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

static int peo(struct perf_event_attr *a, int pid, int cpu)
{
	return syscall(SYS_perf_event_open, a, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC);
}

struct armed {
	int tid, fd;
	void *base;
};
static struct armed A[MAXT];
static int nA;
static long samples, lost, open_fail, last_fail_errno;

static void drain(struct armed *x)
{
	struct perf_event_mmap_page *m = x->base;
	unsigned char *data = (unsigned char *)x->base + PG;
	uint64_t head = __atomic_load_n(&m->data_head, __ATOMIC_ACQUIRE), tail = m->data_tail;
	while (tail < head) {
		struct perf_event_header h;
		for (size_t i = 0; i < sizeof h; i++)
			((unsigned char *)&h)[i] = data[(tail + i) % PG];
		if (h.type == PERF_RECORD_SAMPLE)
			samples++;
		else if (h.type == PERF_RECORD_LOST) {
			uint64_t l = 0;
			for (size_t i = 0; i < 8; i++)
				((unsigned char *)&l)[i] = data[(tail + 16 + i) % PG];
			lost += l;
		}
		if (h.size < sizeof h)
			break;
		tail += h.size;
	}
	__atomic_store_n(&m->data_tail, tail, __ATOMIC_RELEASE);
}

static int find_armed(int tid)
{
	for (int i = 0; i < nA; i++)
		if (A[i].tid == tid)
			return i;
	return -1;
}

/* a breakpoint with its own 1+1-page ring on tid; 0 on success */
static int arm_perf(int tid)
{
	if (find_armed(tid) >= 0)
		return 0;
	struct perf_event_attr a;
	bp_attr(&a, &watched);
	int fd = peo(&a, tid, -1);
	if (fd < 0) {
		open_fail++;
		last_fail_errno = errno;
		return -errno;
	}
	void *b = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (b == MAP_FAILED) {
		int e = errno;
		close(fd);
		open_fail++;
		last_fail_errno = 1000 + e;
		return -e;
	}
	A[nA++] = (struct armed){tid, fd, b};
	return 0;
}

static void disarm_perf(int tid)
{
	int i = find_armed(tid);
	if (i < 0)
		return;
	drain(&A[i]);
	munmap(A[i].base, 2 * PG);
	close(A[i].fd);
	A[i] = A[--nA];
}

static void drain_all(void)
{
	for (int i = 0; i < nA; i++)
		drain(&A[i]);
}

/* ---- debug registers through ptrace ---- */
static int arm_dr7(int tid)
{
	long dr7 = 1 | (1L << 16) | (2L << 18);	/* L0, write, 8 bytes */
	if (ptrace(PTRACE_POKEUSER, tid, offsetof(struct user, u_debugreg[0]), (void *)&watched))
		return -errno;
	if (ptrace(PTRACE_POKEUSER, tid, offsetof(struct user, u_debugreg[7]), (void *)dr7))
		return -errno;
	return 0;
}

/* ---- /proc ---- */
static int list_tasks(int pid, int *out, int max)
{
	char p[64];
	snprintf(p, sizeof p, "/proc/%d/task", pid);
	DIR *d = opendir(p);
	int n = 0;
	if (!d)
		return -1;
	struct dirent *e;
	while ((e = readdir(d)) && n < max)
		if (e->d_name[0] != '.')
			out[n++] = atoi(e->d_name);
	closedir(d);
	return n;
}

static char task_state(int pid, int tid)
{
	char p[96], b[512];
	snprintf(p, sizeof p, "/proc/%d/task/%d/stat", pid, tid);
	int fd = open(p, O_RDONLY);
	if (fd < 0)
		return '?';
	int n = read(fd, b, sizeof b - 1);
	close(fd);
	if (n <= 0)
		return '?';
	b[n] = 0;
	char *q = strrchr(b, ')');
	return q && q[1] && q[2] ? q[2] : '?';
}

/* ---- the tracer ---- */
enum { K_PERF, K_DR7, K_NOPERF };
struct stops {
	long clone, newthread, exits, sigtrap, othersig, interrupts;
};

static int known[MAXT], nknown;
static int gone[MAXT], ngone;	/* threads whose exit was reaped */

static int is_gone(int t)
{
	for (int i = 0; i < ngone && i < MAXT; i++)
		if (gone[i] == t)
			return 1;
	return 0;
}
static int is_known(int t)
{
	for (int i = 0; i < nknown; i++)
		if (known[i] == t)
			return 1;
	return 0;
}

static void add_known(int t)
{
	if (!is_known(t) && nknown < MAXT)
		known[nknown++] = t;
}

/* The watcher. Seizes every thread of pid (TRACECLONE), arms them, then
 * serves stops and drains rings until the target is gone. Reports stop
 * counts through *st at the moments shm->writing changes (clone mode). */
static void tracer(int pid, int kind, int writing_snapshots)
{
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGCHLD);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	int sfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
	struct stops st = {0}, at1 = {0};
	long s_at1 = 0, l_at1 = 0;
	int seen_writing = 0;
	long opts = PTRACE_O_TRACECLONE;
	/* seize every thread, until a pass finds no new one */
	for (int again = 1; again;) {
		int t[MAXT];
		int n = list_tasks(pid, t, MAXT);
		again = 0;
		for (int i = 0; i < n; i++) {
			if (is_known(t[i]))
				continue;
			if (ptrace(PTRACE_SEIZE, t[i], 0, (void *)opts) == 0) {
				add_known(t[i]);
				again = 1;
				if (kind == K_PERF)
					arm_perf(t[i]);
				else if (kind == K_DR7) {
					ptrace(PTRACE_INTERRUPT, t[i], 0, 0);
					st.interrupts++;
				}
			} else if (errno == EPERM) {
				/* auto-attached already through a clone */
			}
		}
	}
	__atomic_store_n(&S->armed, 1, __ATOMIC_RELEASE);
	fset(&S->phase, 1);
	for (;;) {
		int status;
		int tid = waitpid(-1, &status, __WALL | WNOHANG);
		if (tid == 0) {
			/* nothing to reap: wait for SIGCHLD or ring data */
			struct pollfd p[1 + 64];
			int np = 0;
			p[np++] = (struct pollfd){.fd = sfd, .events = POLLIN};
			for (int i = 0; i < nA && np < 65; i++)
				p[np++] = (struct pollfd){.fd = A[i].fd, .events = POLLIN};
			poll(p, np, 20);
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0)
				;
			drain_all();
			if (kind == K_PERF)
				S->hits = samples;
			if (writing_snapshots) {
				static int said;
				if (!said && __atomic_load_n(&S->clonedone, __ATOMIC_ACQUIRE)) {
					said = 1;
					printf("watcher: after the create+join loop: %ld clone stops, "
					       "%ld new-thread stops, %ld thread exits, %ld SIGTRAP stops, "
					       "%ld other signal stops; %ld samples, %ld lost\n",
					       st.clone, st.newthread, st.exits, st.sigtrap, st.othersig,
					       samples, lost);
				}
				int w = __atomic_load_n(&S->writing, __ATOMIC_ACQUIRE);
				if (w == 1 && seen_writing == 0) {
					at1 = st;
					s_at1 = samples;
					l_at1 = lost;
					seen_writing = 1;
				} else if (w == 2 && seen_writing == 1) {
					seen_writing = 2;
					printf("watcher: during the writes: %ld clone stops, %ld new-thread stops, "
					       "%ld thread exits, %ld SIGTRAP stops, %ld other signal stops; "
					       "%ld samples, %ld lost\n",
					       st.clone - at1.clone, st.newthread - at1.newthread,
					       st.exits - at1.exits, st.sigtrap - at1.sigtrap,
					       st.othersig - at1.othersig, samples - s_at1, lost - l_at1);
				}
			}
			continue;
		}
		if (tid < 0) {
			if (errno == EINTR)
				continue;
			break;	/* no tracee left */
		}
		if (WIFEXITED(status) || WIFSIGNALED(status)) {
			st.exits++;
			gone[ngone++ % MAXT] = tid;
			if (kind == K_PERF)
				disarm_perf(tid);
			if (tid == pid)
				break;
			continue;
		}
		if (!WIFSTOPPED(status))
			continue;
		int sig = WSTOPSIG(status), ev = status >> 16, inject = 0;
		if (ev == PTRACE_EVENT_CLONE) {
			unsigned long nt;
			ptrace(PTRACE_GETEVENTMSG, tid, 0, &nt);
			st.clone++;
			add_known(nt);
			/* the new thread's own stop may have come first, and the
			 * thread may have run and exited since */
			if (kind == K_PERF && !is_gone(nt))
				arm_perf(nt);
		} else if (ev == PTRACE_EVENT_STOP) {
			/* a new thread's first stop, or our interrupt */
			st.newthread++;
			add_known(tid);
			if (kind == K_PERF)
				arm_perf(tid);
			else if (kind == K_DR7)
				arm_dr7(tid);
		} else if (sig == SIGTRAP) {
			st.sigtrap++;
			S->hits = st.sigtrap;
		} else {
			st.othersig++;
			inject = sig;
		}
		ptrace(PTRACE_CONT, tid, 0, (void *)(long)inject);
	}
	drain_all();
	printf("watcher: %ld clone stops, %ld new-thread stops (%ld of them our interrupts), "
	       "%ld thread exits, %ld SIGTRAP stops, %ld other signal stops; %ld samples, %ld lost, "
	       "%ld failed arms (last errno %ld, +1000 if mmap)\n",
	       st.clone, st.newthread, st.interrupts, st.exits, st.sigtrap, st.othersig, samples, lost,
	       open_fail, last_fail_errno);
	fflush(stdout);
}

/* ---- clone ---- */
static void *one_store(void *arg)
{
	watched = (long)arg;
	return NULL;
}

static void *writer(void *arg)
{
	fwait(&S->writing, 1);
	for (long k = 0; k < 25000; k++)
		watched = k;
	return NULL;
}

static int cmd_clone(const char *mode, int n)
{
	pid_t t = fork();
	if (t == 0) {
		fwait(&S->phase, 1);
		for (int i = 0; i < n; i++) {
			pthread_t th;
			long t0 = now_ns();
			pthread_create(&th, NULL, one_store, (void *)(long)i);
			pthread_join(th, NULL);
			S->lat_us[i % 4096] = (now_ns() - t0) / 1000.0;
		}
		usleep(50000);
		fset(&S->clonedone, 1);
		usleep(50000);
		pthread_t w[4];
		for (int i = 0; i < 4; i++)
			pthread_create(&w[i], NULL, writer, NULL);
		usleep(20000);
		long t0 = now_ns();
		fset(&S->writing, 1);
		for (int i = 0; i < 4; i++)
			pthread_join(w[i], NULL);
		long t1 = now_ns();
		usleep(50000);	/* let the watcher drain and see the end */
		fset(&S->writing, 2);
		usleep(50000);
		printf("target: 100000 stores by 4 threads in %.1f ms\n", (t1 - t0) / 1e6);
		fflush(stdout);
		_exit(0);
	}
	pid_t w = -1;
	if (!strcmp(mode, "none"))
		fset(&S->phase, 1);
	else {
		w = fork();
		if (w == 0) {
			tracer(t, !strcmp(mode, "traced") ? K_PERF : K_NOPERF, 1);
			_exit(0);
		}
	}
	int st;
	waitpid(t, &st, 0);
	if (w > 0)
		waitpid(w, NULL, 0);
	int m = n < 4096 ? n : 4096;
	qsort(S->lat_us, m, sizeof(double), cmpd);
	printf("%s: %d pthread_create+join: p50 %.1f us, p99 %.1f us\n", mode, n,
	       S->lat_us[m / 2], S->lat_us[m * 99 / 100]);
	return 0;
}

/* ---- kill ---- */
static void *kwriter(void *arg)
{
	long i = (long)arg;
	struct timespec d = {0, 200000};
	for (;;) {
		watched = i;
		S->counter[i]++;
		nanosleep(&d, NULL);
	}
	return NULL;
}

static void *short_thread(void *arg)
{
	for (int k = 0; k < 5; k++)
		watched = k;
	return NULL;
}

static void *kcreator(void *arg)
{
	for (;;) {
		pthread_t th;
		if (pthread_create(&th, NULL, short_thread, NULL) == 0) {
			pthread_join(th, NULL);
			S->created++;
		}
		usleep(500);
	}
	return NULL;
}

static int cmd_kill(const char *kind, int rounds)
{
	int k = !strcmp(kind, "dr7") ? K_DR7 : K_PERF;
	int survived = 0, clean = 0;
	srand(getpid());
	for (int r = 0; r < rounds; r++) {
		memset(S, 0, offsetof(struct shm, tid));
		pid_t t = fork();
		if (t == 0) {
			pthread_t th;
			for (long i = 0; i < 16; i++)
				pthread_create(&th, NULL, kwriter, (void *)i);
			pthread_create(&th, NULL, kcreator, NULL);
			for (;;)
				pause();
		}
		usleep(50000);
		pid_t w = fork();
		if (w == 0) {
			tracer(t, k, 0);
			_exit(0);
		}
		long deadline = now_ns() + 5000000000L;
		while (!__atomic_load_n(&S->armed, __ATOMIC_ACQUIRE) && now_ns() < deadline)
			usleep(1000);
		int delay_ms = 20 + rand() % 281;
		usleep(delay_ms * 1000);
		long hits = S->hits, created = S->created;
		kill(w, SIGKILL);
		waitpid(w, NULL, 0);
		usleep(200000);
		int status = 0;
		pid_t dead = waitpid(t, &status, WNOHANG);
		int stopped = 0, nt = 0, slotfail = 0;
		long progress = 0;
		if (dead == 0) {
			int tids[MAXT];
			nt = list_tasks(t, tids, MAXT);
			for (int i = 0; i < nt; i++) {
				char c = task_state(t, tids[i]);
				stopped += c == 't' || c == 'T';
			}
			long before = 0, after = 0;
			for (int i = 0; i < 16; i++)
				before += S->counter[i];
			usleep(100000);
			for (int i = 0; i < 16; i++)
				after += S->counter[i];
			progress = after - before;
			nt = list_tasks(t, tids, MAXT);
			for (int i = 0; i < nt; i++) {
				int fds[4];
				for (int j = 0; j < 4; j++) {
					struct perf_event_attr a;
					bp_attr(&a, &spare[j]);
					fds[j] = peo(&a, tids[i], -1);
					if (fds[j] < 0 && errno != ESRCH)
						slotfail++;
				}
				for (int j = 0; j < 4; j++)
					if (fds[j] >= 0)
						close(fds[j]);
			}
			usleep(50000);
			dead = waitpid(t, &status, WNOHANG);
		}
		if (dead == 0) {
			survived++;
			clean += stopped == 0 && slotfail == 0 && progress > 0;
			printf("round %2d: killed %3d ms after arming (%ld hits, %ld threads created so far); "
			       "target alive, %d threads, %d stopped, %ld stores in 100 ms, "
			       "%d fresh breakpoints refused\n",
			       r, delay_ms, hits, created, nt, stopped, progress, slotfail);
			kill(t, SIGKILL);
			waitpid(t, &status, 0);
		} else
			printf("round %2d: killed %3d ms after arming (%ld hits, %ld threads created so far); "
			       "target dead: %s %d\n",
			       r, delay_ms, hits, created, WIFSIGNALED(status) ? "signal" : "exit",
			       WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
		fflush(stdout);
	}
	printf("%s: target survived %d of %d rounds; running, unstopped, 4 slots free in %d\n", kind,
	       survived, rounds, clean);
	return 0;
}

/* ---- poll ---- */
static long lifetime_us;

static void *timed_thread(void *arg)
{
	long i = (long)arg;
	S->start_ns[i] = now_ns();
	S->tid[i] = gettid();
	struct timespec d = {lifetime_us / 1000000, (lifetime_us % 1000000) * 1000};
	nanosleep(&d, NULL);
	return NULL;
}

static int cmd_poll(long interval_us, long life_us, int count, long spacing_us)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	memset(S, 0, sizeof *S);
	lifetime_us = life_us;
	pid_t t = fork();
	if (t == 0) {
		srand(getpid());
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&at, 64 * 1024);
		fwait(&S->phase, 1);
		for (long i = 0; i < count; i++) {
			pthread_t th;
			pthread_create(&th, &at, timed_thread, (void *)i);
			struct timespec d = {0, (rand() % (2 * spacing_us + 1)) * 1000};
			nanosleep(&d, NULL);
		}
		struct timespec d = {life_us / 1000000 + 1, 0};
		nanosleep(&d, NULL);
		_exit(0);
	}
	/* the watcher is this process (it is the target's parent here, but
	 * uses nothing of that: no ptrace, no wait until the end) */
	static int seen_tid[MAXT];
	static long arm_ns[MAXT];
	int nseen = 0;
	long scans = 0, scan_ns = 0;
	fset(&S->phase, 1);
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	int self = t;
	for (;;) {
		int tids[MAXT];
		long s0 = now_ns();
		int n = list_tasks(t, tids, MAXT);
		if (n < 0)
			break;
		for (int i = 0; i < n; i++) {
			if (tids[i] == self)
				continue;
			int known_i = -1;
			for (int j = nseen - 1; j >= 0; j--)
				if (seen_tid[j] == tids[i]) {
					known_i = j;
					break;
				}
			if (known_i >= 0)
				continue;
			if (nseen >= MAXT)
				break;
			seen_tid[nseen] = tids[i];
			arm_ns[nseen] = arm_perf(tids[i]) == 0 ? now_ns() : -1;
			nseen++;
		}
		/* close what is gone */
		for (int i = 0; i < nA; i++) {
			int present = 0;
			for (int j = 0; j < n; j++)
				present |= tids[j] == A[i].tid;
			if (!present) {
				disarm_perf(A[i].tid);
				i--;
			}
		}
		scan_ns += now_ns() - s0;
		scans++;
		int st;
		if (waitpid(t, &st, WNOHANG) == t)
			break;
		next.tv_nsec += interval_us * 1000;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	int armed = 0, seen = 0;
	static double lat[MAXT];
	for (int i = 0; i < count; i++) {
		for (int j = 0; j < nseen; j++)
			if (seen_tid[j] == S->tid[i]) {
				seen++;
				if (arm_ns[j] > 0)
					lat[armed++] = (arm_ns[j] - S->start_ns[i]) / 1000.0;
				break;
			}
	}
	qsort(lat, armed, sizeof(double), cmpd);
	printf("poll every %ld us, threads living %ld us, %d threads (one every 0-%ld us): "
	       "seen %d (%.1f%%), armed %d (%.1f%%); first instruction to armed: p50 %.0f us, "
	       "p99 %.0f us, max %.0f us; %ld scans, %.1f us per scan (listing and arming); "
	       "failed opens %ld, last errno %ld (+1000 if mmap)\n",
	       interval_us, life_us, count, 2 * spacing_us, seen, 100.0 * seen / count, armed,
	       100.0 * armed / count, armed ? lat[armed / 2] : 0, armed ? lat[armed * 99 / 100] : 0,
	       armed ? lat[armed - 1] : 0, scans, scan_ns / 1000.0 / scans, open_fail, last_fail_errno);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	PG = sysconf(_SC_PAGESIZE);
	S = mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (argc < 2)
		goto usage;
	printf("uid %d euid %d, online CPUs %ld\n", getuid(), geteuid(), sysconf(_SC_NPROCESSORS_ONLN));
	if (!strcmp(argv[1], "clone") && argc == 4)
		return cmd_clone(argv[2], atoi(argv[3]));
	if (!strcmp(argv[1], "kill") && argc == 4)
		return cmd_kill(argv[2], atoi(argv[3]));
	if (!strcmp(argv[1], "poll") && argc == 6)
		return cmd_poll(atol(argv[2]), atol(argv[3]), atoi(argv[4]), atol(argv[5]));
usage:
	fprintf(stderr, "usage: see the comment at the top of the file\n");
	return 2;
}
