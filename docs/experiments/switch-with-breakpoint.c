/*
 * What an armed data breakpoint costs a process that is switched out and
 * in at every round, as AFL++'s persistent mode does to its target (the
 * target raises SIGSTOP after each input; the fork server waits for the
 * stop with waitpid(WUNTRACED) and continues it with SIGCONT).
 *
 * A parent and its forked child exchange ROUNDS rounds, either by that
 * stop and continue ("stop") or by one byte each way over two pipes
 * ("pipe"). A write breakpoint (perf_event_open, PERF_TYPE_BREAKPOINT,
 * 8 bytes, on a variable neither ever writes: no trap is ever taken) is
 * armed on nobody, on the child, on the parent, on both (opened for
 * each), or on the parent before the fork with inherit=1 ("inherited":
 * the child's is the kernel's copy, as wpd's --follow-forks arms a
 * fork server's children); "software" opens a software event (no debug
 * register) on both instead, perf's own cost of switching a task with
 * events. Both processes are pinned to one CPU (as afl-fuzz pins itself
 * and its target) or left free. EVENTS opens that many events on each
 * armed process; "disabled" disables them after opening (they stay in
 * the task's context); "cpuwide" also opens a software event on CPU 0
 * for every task, as wpd's per-CPU collectors are.
 *
 *   cc -O2 -o /tmp/swbp docs/experiments/switch-with-breakpoint.c
 *   for r in 1 2 3; do for x in stop pipe; do
 *     for w in none child parent both inherited software; do
 *       /tmp/swbp $x $w 1 50000; done; done; done
 *
 * (kernel-facts §19 has the medians; PIN 0 leaves the two free.)
 *
 * Prints the wall time per round in microseconds. Run as root (or with
 * perf_event_paranoid <= 1).
 */
#define _GNU_SOURCE
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile long never_written[8];

/* A write breakpoint on `never_written` for `pid` (0: this process),
 * inherited by children forked later if `inherit`; with `software`, a
 * software event instead (perf's own switching without debug registers). */
static int event_on(pid_t pid, int inherit, int software)
{
	struct perf_event_attr a;
	memset(&a, 0, sizeof a);
	a.size = sizeof a;
	if (software) {
		a.type = PERF_TYPE_SOFTWARE;
		a.config = PERF_COUNT_SW_DUMMY;
	} else {
		a.type = PERF_TYPE_BREAKPOINT;
		a.bp_type = HW_BREAKPOINT_W;
		a.bp_addr = (unsigned long)&never_written[0];
		a.bp_len = HW_BREAKPOINT_LEN_8;
	}
	a.sample_period = 1;
	a.exclude_kernel = 1;
	a.exclude_hv = 1;
	a.inherit = inherit;
	int fd = syscall(SYS_perf_event_open, &a, pid, -1, -1, 0);
	if (fd < 0) {
		perror("perf_event_open");
		exit(1);
	}
	return fd;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr,
			"usage: %s stop|pipe none|child|parent|both|inherited|software PIN(0|1) ROUNDS"
			" [EVENTS [plain|disabled|cpuwide]]\n",
			argv[0]);
		return 2;
	}
	int events = argc > 5 ? atoi(argv[5]) : 1;
	const char *extra = argc > 6 ? argv[6] : "plain";
	int disabled = !strcmp(extra, "disabled");
	if (!strcmp(extra, "cpuwide")) {
		/* A software event on CPU 0 for every task, as wpd's collectors are. */
		struct perf_event_attr a;
		memset(&a, 0, sizeof a);
		a.size = sizeof a;
		a.type = PERF_TYPE_SOFTWARE;
		a.config = PERF_COUNT_SW_DUMMY;
		a.task = 1;
		a.exclude_kernel = 1;
		if (syscall(SYS_perf_event_open, &a, -1, 0, -1, 0) < 0) {
			perror("perf_event_open (cpu)");
			return 1;
		}
	}
	int stop = !strcmp(argv[1], "stop");
	const char *who = argv[2];
	int pinned = atoi(argv[3]);
	long rounds = atol(argv[4]);
	if (pinned) {
		cpu_set_t s;
		CPU_ZERO(&s);
		CPU_SET(0, &s);
		sched_setaffinity(0, sizeof s, &s);
	}
	int inherited = !strcmp(who, "inherited");
	int software = !strcmp(who, "software");
	int both = !strcmp(who, "both") || software;
	if (inherited)
		event_on(0, 1, 0);
	int to_child[2], to_parent[2];
	if (pipe(to_child) || pipe(to_parent))
		return 1;
	pid_t child = fork();
	if (child == 0) {
		char c = 0;
		if (stop) {
			for (;;)
				raise(SIGSTOP);
		}
		for (;;) {
			if (read(to_child[0], &c, 1) != 1)
				_exit(0);
			if (write(to_parent[1], &c, 1) != 1)
				_exit(0);
		}
	}
	/* The child's first stop (or its first round) before anything is armed. */
	int status;
	char c = 0;
	if (stop) {
		waitpid(child, &status, WUNTRACED);
	} else {
		if (write(to_child[1], &c, 1) != 1 || read(to_parent[0], &c, 1) != 1)
			return 1;
	}
	for (int e = 0; e < events; e++) {
		int fd;
		if (!strcmp(who, "child") || both) {
			fd = event_on(child, 0, software);
			if (disabled)
				ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
		}
		if (!strcmp(who, "parent") || both) {
			fd = event_on(0, 0, software);
			if (disabled)
				ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
		}
	}
	double t0 = now();
	for (long i = 0; i < rounds; i++) {
		if (stop) {
			kill(child, SIGCONT);
			waitpid(child, &status, WUNTRACED);
		} else {
			if (write(to_child[1], &c, 1) != 1 || read(to_parent[0], &c, 1) != 1)
				return 1;
		}
	}
	double t = now() - t0;
	kill(child, SIGKILL);
	waitpid(child, &status, 0);
	printf("%s breakpoint=%-9s pinned=%d events=%d %-8s: %.2f us per round\n", argv[1], who,
	       pinned, events, extra, t * 1e6 / rounds);
	return 0;
}
