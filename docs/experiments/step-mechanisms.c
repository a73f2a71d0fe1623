// What a debugger's step costs and risks with each mechanism the kernel
// offers a ptrace tracer on x86-64 (kernel-facts §22).
//
// A child runs `spin`, a loop of `call leaf; nop; jmp`, traced with
// PTRACE_SEIZE. The parent then measures, each N times:
//   singlestep  PTRACE_SINGLESTEP of one instruction, to its SIGTRAP stop
//   uprobe      a BPF link of one uprobe (BPF_TRACE_UPROBE_MULTI, the child's
//               pid) on the instruction the thread is stopped at, whose
//               program sends SIGURG to that one thread; PTRACE_CONT to the
//               SIGURG stop (where the thread stops: after the probed
//               instruction); the link created before and closed after,
//               on this thread or on another one
//   uretprobe   the same as a return probe (BPF_F_UPROBE_MULTI_RETURN) on the
//               first instruction of `leaf`, created while the thread is
//               stopped there (after a single step of the call): where the
//               thread stops when `leaf` returns
// and then what becomes of the child when its tracer dies while the child
// is held (tracer SIGKILLed):
//   death-trap   held in the SIGTRAP stop of a single step
//   death-event  the same stop turned into a PTRACE_EVENT_STOP first
//                (PTRACE_INTERRUPT, then PTRACE_CONT with no signal)
//   death-stepping  PTRACE_SINGLESTEP issued, tracer killed before waiting
//
//   gcc -O1 -no-pie docs/experiments/step-mechanisms.c -o /tmp/step-mech -lpthread
//   /tmp/step-mech 2000
//
// Root only (BPF). Prints p50/p90 of each round trip in microseconds.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

asm(".text\n"
    ".globl spin\n"
    "spin:\n"
    "1: call leaf\n"
    "   nop\n"
    "   jmp 1b\n"
    ".globl leaf\n"
    "leaf:\n"
    "   mov $1, %eax\n"
    "   ret\n");
void spin(void);
void leaf(void);

#define TRACE_UPROBE_MULTI 48
#define LINK_CREATE 28
#define UPROBE_MULTI_RETURN 1

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int file_offset(void *addr, char *path, size_t n, uint64_t *off) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uint64_t a = (uint64_t)addr;
    while (fgets(line, sizeof line, f)) {
        uint64_t lo, hi, fo;
        char perms[8], p[256] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %255s", &lo, &hi, perms, &fo, p) >= 4 &&
            a >= lo && a < hi) {
            snprintf(path, n, "%s", p);
            *off = a - lo + fo;
            fclose(f);
            return 0;
        }
    }
    fclose(f);
    return -1;
}

// r1 = ctx; if (tid of current != TID) return 0; send_signal_thread(SIGURG)
static int load_prog(pid_t tid) {
    struct bpf_insn insns[] = {
        {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_get_current_pid_tgid},
        {.code = BPF_ALU | BPF_MOV | BPF_X, .dst_reg = 0, .src_reg = 0},
        {.code = BPF_JMP | BPF_JNE | BPF_K, .dst_reg = 0, .off = 2, .imm = tid},
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 1, .imm = SIGURG},
        {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_send_signal_thread},
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 0, .imm = 0},
        {.code = BPF_JMP | BPF_EXIT},
    };
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_KPROBE;
    a.insns = (uint64_t)insns;
    a.insn_cnt = sizeof insns / sizeof insns[0];
    a.license = (uint64_t)"GPL";
    a.expected_attach_type = TRACE_UPROBE_MULTI;
    return syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
}

static int link_uprobe(int prog, const char *path, uint64_t off, pid_t pid, int ret) {
    uint64_t a[16];
    memset(a, 0, sizeof a);
    uint32_t *w = (uint32_t *)a;
    w[0] = prog;
    w[2] = TRACE_UPROBE_MULTI;
    a[2] = (uint64_t)path;
    a[3] = (uint64_t)&off;
    w[12] = 1;
    w[13] = ret ? UPROBE_MULTI_RETURN : 0;
    w[14] = pid;
    return syscall(SYS_bpf, LINK_CREATE, a, sizeof a);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    printf("%-34s p50 %7.1f us  p90 %7.1f us  (n=%d)\n", what, v[n / 2], v[n * 9 / 10], n);
}

static uint64_t rip_of(pid_t t) {
    struct user_regs_struct r;
    ptrace(PTRACE_GETREGS, t, 0, &r);
    return r.rip;
}

static uint64_t rsp_of(pid_t t) {
    struct user_regs_struct r;
    ptrace(PTRACE_GETREGS, t, 0, &r);
    return r.rsp;
}

// Waits for the next stop of t; returns the signal of a stop, -1 on exit.
static int wait_stop(pid_t t, int *event) {
    int st;
    if (waitpid(t, &st, __WALL) < 0 || !WIFSTOPPED(st)) return -1;
    *event = st >> 16;
    return WSTOPSIG(st);
}

// Single-steps t until it is at `at`.
static void step_to(pid_t t, uint64_t at) {
    int ev;
    for (int i = 0; i < 100 && rip_of(t) != at; i++) {
        ptrace(PTRACE_SINGLESTEP, t, 0, 0);
        wait_stop(t, &ev);
    }
}

static pid_t start_child(void) {
    pid_t c = fork();
    if (c == 0) {
        spin();
        _exit(0);
    }
    ptrace(PTRACE_SEIZE, c, 0, 0);
    ptrace(PTRACE_INTERRUPT, c, 0, 0);
    int ev;
    wait_stop(c, &ev);
    step_to(c, (uint64_t)spin);
    return c;
}

static int closing_fd = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static void *closer(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (closing_fd < 0) pthread_cond_wait(&cv, &mu);
        int fd = closing_fd;
        closing_fd = -1;
        pthread_mutex_unlock(&mu);
        close(fd);
    }
    return NULL;
}
static void close_elsewhere(int fd) {
    pthread_mutex_lock(&mu);
    while (closing_fd >= 0) {
        pthread_mutex_unlock(&mu);
        usleep(10);
        pthread_mutex_lock(&mu);
    }
    closing_fd = fd;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

// The child's fate after its tracer (a process of its own) is killed while
// the child is held as `how` says: "alive" or how it ended.
static const char *death(int how) {
    int pipefd[2];
    if (pipe(pipefd)) return "pipe";
    pid_t child = fork();
    if (child == 0) {
        spin();
        _exit(0);
    }
    pid_t tracer = fork();
    if (tracer == 0) {
        ptrace(PTRACE_SEIZE, child, 0, 0);
        ptrace(PTRACE_INTERRUPT, child, 0, 0);
        int ev;
        wait_stop(child, &ev);
        ptrace(PTRACE_SINGLESTEP, child, 0, 0);
        if (how != 2) wait_stop(child, &ev); // the SIGTRAP stop
        if (how == 1) {
            ptrace(PTRACE_INTERRUPT, child, 0, 0);
            ptrace(PTRACE_CONT, child, 0, 0);
            wait_stop(child, &ev); // PTRACE_EVENT_STOP
            if (ev != PTRACE_EVENT_STOP) write(pipefd[1], "E", 1);
        }
        write(pipefd[1], "x", 1);
        pause();
        _exit(0);
    }
    char b;
    read(pipefd[0], &b, 1);
    kill(tracer, SIGKILL);
    waitpid(tracer, NULL, 0);
    usleep(200 * 1000);
    int st;
    static char out[64];
    if (waitpid(child, &st, WNOHANG) == child)
        snprintf(out, sizeof out, "dead (signal %d)", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    else
        snprintf(out, sizeof out, "alive%s", b == 'E' ? " (no event stop)" : "");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(pipefd[0]);
    close(pipefd[1]);
    return out;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    char path[256];
    uint64_t spin_off, leaf_off;
    if (file_offset((void *)spin, path, sizeof path, &spin_off) ||
        file_offset((void *)leaf, path, sizeof path, &leaf_off))
        return 1;
    double *v = calloc(n, sizeof *v);
    double *w = calloc(n, sizeof *w);
    double *x = calloc(n, sizeof *x);
    pthread_t th;
    pthread_create(&th, NULL, closer, NULL);

    pid_t c = start_child();
    int ev;
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        ptrace(PTRACE_SINGLESTEP, c, 0, 0);
        wait_stop(c, &ev);
        v[i] = now_us() - t0;
    }
    report("singlestep round trip", v, n);

    int prog = load_prog(c);
    if (prog < 0) {
        perror("BPF_PROG_LOAD");
        return 1;
    }
    // uprobe on the `nop` after the call: the thread stops after it (at the
    // jmp). Its link closed at once on this thread (sync), on another thread
    // (async), or kept open until the end (none).
    uint64_t nop = (uint64_t)spin + 5;
    int *kept = calloc(n, sizeof *kept);
    const char *modes[] = {"close: none", "close: async", "close: sync"};
    for (int mode = 0; mode < 3; mode++) {
        int wrong = 0;
        for (int i = 0; i < n; i++) {
            step_to(c, nop);
            double t0 = now_us();
            int fd = link_uprobe(prog, path, spin_off + 5, c, 0);
            double t1 = now_us();
            if (fd < 0) {
                perror("LINK_CREATE");
                return 1;
            }
            ptrace(PTRACE_CONT, c, 0, 0);
            int sig = wait_stop(c, &ev);
            double t2 = now_us();
            if (sig != SIGURG || rip_of(c) != nop + 1) wrong++;
            double t3 = now_us();
            if (mode == 0)
                kept[i] = fd;
            else if (mode == 1)
                close_elsewhere(fd);
            else
                close(fd);
            double t4 = now_us();
            v[i] = t1 - t0;
            w[i] = t2 - t1;
            x[i] = t4 - t3;
        }
        char what[96];
        snprintf(what, sizeof what, "uprobe link create (%s)", modes[mode]);
        report(what, v, n);
        snprintf(what, sizeof what, "uprobe cont to stop (%s)", modes[mode]);
        report(what, w, n);
        if (mode) {
            snprintf(what, sizeof what, "link close (%s)", modes[mode]);
            report(what, x, n);
        }
        printf("uprobe stops not at the next instruction: %d of %d\n", wrong, n);
        if (mode == 0) {
            double t0 = now_us();
            for (int i = 0; i < n; i++) close(kept[i]);
            printf("closing the %d links kept: %.1f ms\n", n, (now_us() - t0) / 1e3);
        }
    }

    int wrong_ret = 0;
    for (int i = 0; i < n; i++) {
        step_to(c, (uint64_t)spin);
        ptrace(PTRACE_SINGLESTEP, c, 0, 0); // the call: now at leaf
        wait_stop(c, &ev);
        uint64_t sp = rsp_of(c);
        double t0 = now_us();
        int fd = link_uprobe(prog, path, leaf_off, c, 1);
        if (fd < 0) {
            perror("LINK_CREATE ret");
            return 1;
        }
        ptrace(PTRACE_CONT, c, 0, 0);
        int sig = wait_stop(c, &ev);
        v[i] = now_us() - t0;
        // 6.11+: the return trampoline is a syscall; the signal stops the
        // thread just after it, before `pop %r11; pop %rcx; ret`.
        if (i == 0) {
            long code = ptrace(PTRACE_PEEKTEXT, c, rip_of(c), 0);
            printf("  at the return stop: rip %#lx, code there %08lx\n", rip_of(c), code & 0xffffffff);
        }
        if (sig != SIGURG || rip_of(c) != (uint64_t)spin + 5 || rsp_of(c) != sp + 8) {
            if (wrong_ret++ < 3)
                printf("  ret stop: sig %d ev %d rip %#lx (spin %#lx leaf %#lx) sp %#lx want %#lx\n", sig, ev,
                       rip_of(c), (uint64_t)spin, (uint64_t)leaf, rsp_of(c), sp + 8);
        }
        close_elsewhere(fd);
    }
    report("uretprobe at entry: create+cont+stop", v, n);
    printf("uretprobe stops not at the return address: %d of %d\n", wrong_ret, n);
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);

    printf("tracer killed, child held in a single step's SIGTRAP stop: %s\n", death(0));
    printf("tracer killed, that stop turned into an event stop: %s\n", death(1));
    printf("tracer killed, single step issued, not waited for: %s\n", death(2));
    return 0;
}
