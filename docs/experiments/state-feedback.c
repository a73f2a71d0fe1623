// State feedback for a coverage-guided fuzzer from a hardware breakpoint's
// BPF program, without recompiling the target.
//
// A write breakpoint (PERF_TYPE_BREAKPOINT, HW_BREAKPOINT_W) on a variable
// traps after every store to it; a BPF_PROG_TYPE_PERF_EVENT program attached
// with PERF_EVENT_IOC_SET_BPF runs at the trap, in the storing task. The
// feedback program reads the new value (bpf_probe_read_user), hashes it,
// optionally with the previous hash as AFL hashes edges, reads the map
// pointer (AFL++'s `__afl_area_ptr`) from the task, and increments the byte
// `hash % map_size` of the map with bpf_probe_write_user. The program is
// raw instructions loaded with bpf(2); no libbpf. A per-CPU array map keeps
// counters: traps, failed reads, failed writes, bytes written, the last
// error.
//
//   gcc -O2 -Wall docs/experiments/state-feedback.c -o /tmp/state-feedback
//
//   /tmp/state-feedback self [N]
//       In this process: the program loads (verifier log and the kernel's
//       log lines printed), then the feedback lands in a SysV shm map, in a
//       private page, and in a shm map never touched by this process (its
//       pages not present); every byte is compared with the same hash done
//       here. Then the cost per store of a loop of N stores (default
//       200,000): no breakpoint, a breakpoint without a program, with an
//       empty program, with the feedback program; 7 rounds, medians.
//
//   /tmp/state-feedback info PID BINARY
//       The AFL++ symbols of BINARY in process PID (a fork server or its
//       child): `__afl_area_ptr`, `__afl_map_size`, `__afl_area_initial`
//       read through /proc/PID/mem, and PID's SYSV mappings.
//
//   /tmp/state-feedback attach COMM BINARY VAR SECONDS [edge]
//       Waits for the fork server of an afl-fuzz (the process named COMM
//       whose parent is named afl-fuzz), sets an inherited write breakpoint
//       on BINARY's global VAR (4 or 8 bytes, by its symbol size) in it with
//       the feedback program, and holds it SECONDS, attaching again if the
//       fork server is replaced; prints the counters every 10 s. With
//       `edge`, the previous hash is mixed in. With `signal`, the
//       breakpoint also has sigtrap = 1 and sig_data, the program returns 1
//       and only counts, and a handler preloaded into the target writes
//       the map (state-feedback-preload.c, or state-feedback-grow.c, which
//       also grows the map the fork server reports).
//
// Root only. Everything it starts ends with it (the breakpoints and the
// program are file descriptors of this process).
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/bpf.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// ---- BPF instructions ----------------------------------------------------

#define INSN(c, d, s, o, i) \
    ((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})
#define MOV64_REG(d, s) INSN(BPF_ALU64 | BPF_MOV | BPF_X, d, s, 0, 0)
#define MOV64_IMM(d, i) INSN(BPF_ALU64 | BPF_MOV | BPF_K, d, 0, 0, i)
#define MOV32_REG(d, s) INSN(BPF_ALU | BPF_MOV | BPF_X, d, s, 0, 0)
#define ALU64_IMM(op, d, i) INSN(BPF_ALU64 | (op) | BPF_K, d, 0, 0, i)
#define ALU64_REG(op, d, s) INSN(BPF_ALU64 | (op) | BPF_X, d, s, 0, 0)
#define LDX(sz, d, s, o) INSN(BPF_LDX | (sz) | BPF_MEM, d, s, o, 0)
#define STX(sz, d, s, o) INSN(BPF_STX | (sz) | BPF_MEM, d, s, o, 0)
#define ST_IMM(sz, d, o, i) INSN(BPF_ST | (sz) | BPF_MEM, d, 0, o, i)
#define JMP_IMM(op, d, i, o) INSN(BPF_JMP | (op) | BPF_K, d, 0, o, i)
#define JA(o) INSN(BPF_JMP | BPF_JA, 0, 0, o, 0)
#define CALL(f) INSN(BPF_JMP | BPF_CALL, 0, 0, 0, f)
#define EXIT() INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)
#define LD_IMM64_A(d, v) INSN(BPF_LD | BPF_DW | BPF_IMM, d, 0, 0, (uint32_t)(v))
#define LD_IMM64_B(v) INSN(0, 0, 0, 0, (uint32_t)((uint64_t)(v) >> 32))
#define LD_MAP_A(d, fd) INSN(BPF_LD | BPF_DW | BPF_IMM, d, BPF_PSEUDO_MAP_FD, 0, fd)

enum { R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 };

// Counters in the per-CPU array's one value (u64 each).
enum { C_TRAPS, C_RFAIL, C_WFAIL, C_WRITTEN, C_PREV, C_LASTERR, C_N };
#define GOLDEN 0x9E3779B97F4A7C15ull

static char vlog[1 << 16];
static int prog_type = BPF_PROG_TYPE_PERF_EVENT;
// What the feedback program returns: 0 drops the event's overflow (and its
// SIGTRAP), 1 keeps it.
static int prog_ret;

static long sys_bpf(int cmd, union bpf_attr *a) { return syscall(SYS_bpf, cmd, a, sizeof *a); }

static int stats_map(void) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_PERCPU_ARRAY;
    a.key_size = 4;
    a.value_size = 8 * C_N;
    a.max_entries = 1;
    int fd = sys_bpf(BPF_MAP_CREATE, &a);
    if (fd < 0) perror("BPF_MAP_CREATE"), exit(1);
    return fd;
}

static void stats_read(int fd, uint64_t out[C_N]) {
    int ncpu = sysconf(_SC_NPROCESSORS_CONF);
    uint64_t v[ncpu * C_N];
    uint32_t k = 0;
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = fd;
    a.key = (uint64_t)&k;
    a.value = (uint64_t)v;
    memset(out, 0, 8 * C_N);
    if (sys_bpf(BPF_MAP_LOOKUP_ELEM, &a)) return;
    for (int c = 0; c < ncpu; c++)
        for (int i = 0; i < C_N; i++)
            if (i == C_LASTERR || i == C_PREV) {
                if (v[c * C_N + i]) out[i] = v[c * C_N + i];
            } else
                out[i] += v[c * C_N + i];
}

static void stats_zero(int fd) {
    int ncpu = sysconf(_SC_NPROCESSORS_CONF);
    uint64_t v[ncpu * C_N];
    uint32_t k = 0;
    memset(v, 0, sizeof v);
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = fd;
    a.key = (uint64_t)&k;
    a.value = (uint64_t)v;
    sys_bpf(BPF_MAP_UPDATE_ELEM, &a);
}

static int load(struct bpf_insn *p, int n, int verbose) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = prog_type;
    a.insns = (uint64_t)p;
    a.insn_cnt = n;
    a.license = (uint64_t) "GPL";
    a.log_buf = (uint64_t)vlog;
    a.log_size = sizeof vlog;
    a.log_level = 1;
    vlog[0] = 0;
    int fd = sys_bpf(BPF_PROG_LOAD, &a);
    if (fd < 0 || verbose) {
        if (fd < 0) fprintf(stderr, "BPF_PROG_LOAD (type %d): %s\n", prog_type, strerror(errno));
        // The verifier's last lines: the verdict and its statistics.
        char *s = vlog + strlen(vlog);
        for (int nl = 0; s > vlog && nl < 4; s--)
            if (*s == '\n') nl++;
        fprintf(stderr, "  verifier: %s", s);
    }
    return fd;
}

static int empty_prog(void) {
    struct bpf_insn p[] = {MOV64_IMM(R0, 0), EXIT()};
    return load(p, 2, 0);
}

// The feedback program. `var` the watched variable (vlen 4 or 8 bytes),
// `areap` the address of the map pointer, `msize` the map's size.
static int feedback_prog(int stats, uint64_t var, int vlen, uint64_t areap, uint32_t msize, int edge,
                         int write, int verbose) {
    struct bpf_insn p[80];
    int n = 0, j_out[8], nout = 0, j_rfail[8], nrf = 0, j_wfail;
#define E(x) (p[n++] = (x))
    // r7 = &counters
    E(ST_IMM(BPF_W, R10, -4, 0));
    E(LD_MAP_A(R1, stats));
    E(LD_IMM64_B(0));
    E(MOV64_REG(R2, R10));
    E(ALU64_IMM(BPF_ADD, R2, -4));
    E(CALL(BPF_FUNC_map_lookup_elem));
    j_out[nout++] = n, E(JMP_IMM(BPF_JEQ, R0, 0, 0));
    E(MOV64_REG(R7, R0));
    E(LDX(BPF_DW, R1, R7, 8 * C_TRAPS));
    E(ALU64_IMM(BPF_ADD, R1, 1));
    E(STX(BPF_DW, R7, R1, 8 * C_TRAPS));
    // value: probe_read_user(fp-16, vlen, var)
    E(ST_IMM(BPF_DW, R10, -16, 0));
    E(MOV64_REG(R1, R10));
    E(ALU64_IMM(BPF_ADD, R1, -16));
    E(MOV64_IMM(R2, vlen));
    E(LD_IMM64_A(R3, var));
    E(LD_IMM64_B(var));
    E(CALL(BPF_FUNC_probe_read_user));
    j_rfail[nrf++] = n, E(JMP_IMM(BPF_JNE, R0, 0, 0));
    // r8 = hash(value) = (value * GOLDEN) >> 32
    E(LDX(BPF_DW, R8, R10, -16));
    E(LD_IMM64_A(R1, GOLDEN));
    E(LD_IMM64_B(GOLDEN));
    E(ALU64_REG(BPF_MUL, R8, R1));
    E(ALU64_IMM(BPF_RSH, R8, 32));
    // r9 = (hash ^ prev) % msize; prev = hash >> 1
    E(MOV64_REG(R9, R8));
    if (edge) {
        E(LDX(BPF_DW, R1, R7, 8 * C_PREV));
        E(ALU64_REG(BPF_XOR, R9, R1));
        E(ALU64_IMM(BPF_RSH, R8, 1));
        E(STX(BPF_DW, R7, R8, 8 * C_PREV));
    }
    E(ALU64_IMM(BPF_MOD, R9, msize));
    // r8 = *areap + r9
    E(MOV64_REG(R1, R10));
    E(ALU64_IMM(BPF_ADD, R1, -24));
    E(MOV64_IMM(R2, 8));
    E(LD_IMM64_A(R3, areap));
    E(LD_IMM64_B(areap));
    E(CALL(BPF_FUNC_probe_read_user));
    j_rfail[nrf++] = n, E(JMP_IMM(BPF_JNE, R0, 0, 0));
    E(LDX(BPF_DW, R8, R10, -24));
    E(ALU64_REG(BPF_ADD, R8, R9));
    // byte = *r8 + 1, 0 becomes 1 (AFL++'s NeverZero)
    E(MOV64_REG(R1, R10));
    E(ALU64_IMM(BPF_ADD, R1, -32));
    E(MOV64_IMM(R2, 1));
    E(MOV64_REG(R3, R8));
    E(CALL(BPF_FUNC_probe_read_user));
    j_rfail[nrf++] = n, E(JMP_IMM(BPF_JNE, R0, 0, 0));
    E(LDX(BPF_B, R1, R10, -32));
    E(ALU64_IMM(BPF_ADD, R1, 1));
    E(ALU64_IMM(BPF_AND, R1, 0xff));
    E(JMP_IMM(BPF_JNE, R1, 0, 1));
    E(MOV64_IMM(R1, 1));
    E(STX(BPF_B, R10, R1, -32));
    // probe_write_user(r8, fp-32, 1); without `write`, r0 = 0 instead
    if (!write) {
        E(MOV64_IMM(R0, 0));
        goto written;
    }
    E(MOV64_REG(R1, R8));
    E(MOV64_REG(R2, R10));
    E(ALU64_IMM(BPF_ADD, R2, -32));
    E(MOV64_IMM(R3, 1));
    E(CALL(BPF_FUNC_probe_write_user));
written:
    j_wfail = n, E(JMP_IMM(BPF_JNE, R0, 0, 0));
    E(LDX(BPF_DW, R1, R7, 8 * C_WRITTEN));
    E(ALU64_IMM(BPF_ADD, R1, 1));
    E(STX(BPF_DW, R7, R1, 8 * C_WRITTEN));
    j_out[nout++] = n, E(JA(0));
    // write failed
    p[j_wfail].off = n - j_wfail - 1;
    E(STX(BPF_DW, R7, R0, 8 * C_LASTERR));
    E(LDX(BPF_DW, R1, R7, 8 * C_WFAIL));
    E(ALU64_IMM(BPF_ADD, R1, 1));
    E(STX(BPF_DW, R7, R1, 8 * C_WFAIL));
    j_out[nout++] = n, E(JA(0));
    // a read failed
    for (int i = 0; i < nrf; i++) p[j_rfail[i]].off = n - j_rfail[i] - 1;
    E(STX(BPF_DW, R7, R0, 8 * C_LASTERR));
    E(LDX(BPF_DW, R1, R7, 8 * C_RFAIL));
    E(ALU64_IMM(BPF_ADD, R1, 1));
    E(STX(BPF_DW, R7, R1, 8 * C_RFAIL));
    for (int i = 0; i < nout; i++) p[j_out[i]].off = n - j_out[i] - 1;
    E(MOV64_IMM(R0, prog_ret));
    E(EXIT());
#undef E
    return load(p, n, verbose);
}

// The same index, computed here.
static uint32_t feedback_index(uint64_t v, uint64_t *prev, uint32_t msize, int edge) {
    uint64_t h = (v * GOLDEN) >> 32, i = h;
    if (edge) i ^= *prev, *prev = h >> 1;
    return i % msize;
}

// With `sigdata`, the event sends the storing task a SIGTRAP (si_code
// TRAP_PERF, si_addr the watched address, si_perf_data = sigdata) after each
// store the program, if any, does not drop (returns 0).
static int breakpoint(pid_t pid, uint64_t addr, int len, int inherit, int prog, uint64_t sigdata) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.bp_type = HW_BREAKPOINT_W;
    a.bp_addr = addr;
    a.bp_len = len;
    a.sample_period = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    a.inherit = inherit;
    if (sigdata) a.sigtrap = 1, a.remove_on_exec = 1, a.sig_data = sigdata;
    int fd = syscall(SYS_perf_event_open, &a, pid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "perf_event_open(pid %d, %#lx): %s\n", pid, (unsigned long)addr, strerror(errno));
        return -1;
    }
    if (prog >= 0 && ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog)) {
        fprintf(stderr, "PERF_EVENT_IOC_SET_BPF: %s\n", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void print_stats(const char *what, int fd) {
    uint64_t s[C_N];
    stats_read(fd, s);
    printf("%s: traps %lu, reads failed %lu, writes failed %lu, written %lu, last error %ld\n", what,
           (unsigned long)s[C_TRAPS], (unsigned long)s[C_RFAIL], (unsigned long)s[C_WFAIL],
           (unsigned long)s[C_WRITTEN], (long)s[C_LASTERR]);
}

static void kernel_log_tail(const char *grep) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "dmesg | grep -i '%s' | tail -3", grep);
    if (system(cmd)) {}
}

// ---- the signal alternative ------------------------------------------------
// A handler in the target does the write the program may not: the value at
// si_addr (8 bytes), hashed as the program hashes it without `edge`, counts
// in the map that the pointer at (si_perf_data & 2^48-1) points to, of size
// (si_perf_data >> 48) bytes (below 65,536). state-feedback-preload.c is the same
// handler for LD_PRELOAD (AFL_PRELOAD) into a target.
#define SIGDATA(areap, msize) ((uint64_t)(areap) | (uint64_t)(msize) << 48)

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if (si->si_code != 6 /* TRAP_PERF */) return;
    uint64_t d = *(unsigned long *)((char *)si + 24);  // si_perf_data
    uint8_t *map = *(uint8_t *volatile *)(d & ((1ull << 48) - 1));
    uint32_t msize = d >> 48;
    uint64_t v = *(volatile uint64_t *)si->si_addr;
    uint8_t *b = map + ((v * GOLDEN) >> 32) % msize;
    *b = *b + 1 ? *b + 1 : 1;
}

static void handle_traps(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGTRAP, &sa, 0);
}

// ---- self: the feedback in this process, and what a store costs -------------

volatile uint64_t watched;       // the state variable
uint8_t *volatile area_ptr;      // as __afl_area_ptr
#define MSIZE 65535

__attribute__((noinline)) static double store_loop(long n) {
    double t = now();
    for (long i = 0; i < n; i++) watched = i;
    return (now() - t) / n * 1e9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int self(long n) {
    int stats = stats_map();
    printf("kernel lockdown: ");
    fflush(stdout);
    if (system("cat /sys/kernel/security/lockdown 2>/dev/null || "
               "dmesg | grep -i 'locked down' | tail -1")) {}
    printf("the feedback program, with bpf_probe_write_user, as a perf event program:\n");
    fflush(stdout);
    int fb = feedback_prog(stats, (uint64_t)&watched, 8, (uint64_t)&area_ptr, MSIZE, 1, 1, 1);
    printf("  prog fd %d\n", fb);
    printf("the same, as a kprobe program:\n");
    fflush(stdout);
    prog_type = BPF_PROG_TYPE_KPROBE;
    int kp = feedback_prog(stats, (uint64_t)&watched, 8, (uint64_t)&area_ptr, MSIZE, 1, 1, 1);
    printf("  prog fd %d\n", kp);
    if (kp >= 0) close(kp);
    prog_type = BPF_PROG_TYPE_PERF_EVENT;
    printf("the kernel's log:\n");
    fflush(stdout);
    kernel_log_tail("probe_write_user\\|write user RAM");
    printf("the feedback program without the write:\n");
    fflush(stdout);
    int fbr = feedback_prog(stats, (uint64_t)&watched, 8, (uint64_t)&area_ptr, MSIZE, 1, 0, 1);
    if (fbr < 0) return 1;

    // Where the bytes land, and whether they are right: the program's
    // write if it loaded, else the SIGTRAP handler's.
    handle_traps();
    int id = shmget(IPC_PRIVATE, MSIZE, IPC_CREAT | 0600);
    uint8_t *shm = shmat(id, 0, 0);
    shmctl(id, IPC_RMID, 0);
    memset(shm, 0, MSIZE);
    uint8_t *priv = mmap(0, MSIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(priv, 0, MSIZE);
    int id2 = shmget(IPC_PRIVATE, MSIZE, IPC_CREAT | 0600);
    uint8_t *cold = shmat(id2, 0, 0);  // never touched here
    shmctl(id2, IPC_RMID, 0);
    struct {
        const char *name;
        uint8_t *m;
    } where[] = {{"SysV shm, touched", shm}, {"private anonymous, touched", priv}, {"SysV shm, untouched", cold}};
    static uint8_t expect[MSIZE];
    for (int w = 0; w < 3; w++) {
        area_ptr = where[w].m;
        stats_zero(stats);
        int bp = fb >= 0 ? breakpoint(0, (uint64_t)&watched, 8, 0, fb, 0)
                         : breakpoint(0, (uint64_t)&watched, 8, 0, -1, SIGDATA(&area_ptr, MSIZE));
        if (bp < 0) return 1;
        memset(expect, 0, sizeof expect);
        uint64_t prev = 0;
        long k = 1000;
        for (long i = 0; i < k; i++) {
            watched = i * 7 + 3;
            uint32_t x = feedback_index(i * 7 + 3, &prev, MSIZE, fb >= 0);
            expect[x] = expect[x] + 1 ? expect[x] + 1 : 1;
        }
        close(bp);
        uint64_t s[C_N];
        stats_read(stats, s);
        long same = 0, nz = 0, enz = 0;
        for (int i = 0; i < MSIZE; i++) same += where[w].m[i] == expect[i], nz += !!where[w].m[i], enz += !!expect[i];
        if (fb >= 0)
            printf("program: traps %lu, written %lu, writes failed %lu (last error %ld), reads failed %lu\n",
                   (unsigned long)s[C_TRAPS], (unsigned long)s[C_WRITTEN], (unsigned long)s[C_WFAIL],
                   (long)s[C_LASTERR], (unsigned long)s[C_RFAIL]);
        printf("%s, %-27s %ld stores: map bytes as computed here %ld of %d, nonzero %ld (expected %ld)\n",
               fb >= 0 ? "program" : "SIGTRAP handler", where[w].name, k, same, MSIZE, nz, enz);
    }
    area_ptr = shm;

    // Cost per store.
    int empty = empty_prog();
    enum { NC = 6, ROUNDS = 7 };
    const char *names[NC] = {"a no breakpoint",
                             "  breakpoint, no program",
                             "b breakpoint, empty program",
                             "c breakpoint, feedback program",
                             "c' as c, without the write",
                             "d breakpoint, SIGTRAP, handler"};
    double r[NC][ROUNDS];
    store_loop(n);
    for (int round = 0; round < ROUNDS; round++)
        for (int c = 0; c < NC; c++) {
            int bp = -1;
            if (c == 3 && fb < 0) {
                r[c][round] = 0;
                continue;
            }
            if (c == 1) bp = breakpoint(0, (uint64_t)&watched, 8, 0, -1, 0);
            if (c == 2) bp = breakpoint(0, (uint64_t)&watched, 8, 0, empty, 0);
            if (c == 3) bp = breakpoint(0, (uint64_t)&watched, 8, 0, fb, 0);
            if (c == 4) bp = breakpoint(0, (uint64_t)&watched, 8, 0, fbr, 0);
            if (c == 5) bp = breakpoint(0, (uint64_t)&watched, 8, 0, -1, SIGDATA(&area_ptr, MSIZE));
            r[c][round] = store_loop(n);
            if (bp >= 0) close(bp);
        }
    double med[NC];
    printf("cost per store, %ld stores, %d rounds: median (min-max) ns\n", n, ROUNDS);
    for (int c = 0; c < NC; c++) {
        qsort(r[c], ROUNDS, sizeof(double), cmp_d);
        med[c] = r[c][ROUNDS / 2];
        printf("  %-32s %8.1f (%.1f-%.1f)\n", names[c], med[c], r[c][0], r[c][ROUNDS - 1]);
    }
    if (fb >= 0) printf("  c/b %.3f\n", med[3] / med[2]);
    printf("  c'/b %.3f, d/b %.3f\n", med[4] / med[2], med[5] / med[2]);
    return 0;
}

// ---- info, attach: an afl-cc target under afl-fuzz -------------------------

struct sym {
    uint64_t addr, size;
};

static struct sym symbol(const char *bin, const char *name) {
    char cmd[512], line[512];
    struct sym s = {0, 0};
    snprintf(cmd, sizeof cmd, "nm -S '%s'", bin);
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f)) {
        char t[8], nm[256];
        unsigned long a, z;
        if (sscanf(line, "%lx %lx %7s %255s", &a, &z, t, nm) == 4 && !strcmp(nm, name)) s.addr = a, s.size = z;
    }
    if (f) pclose(f);
    return s;
}

// The load address of the mapping of `bin` at file offset 0 in `pid`.
static uint64_t base_of(pid_t pid, const char *bin) {
    char p[64], line[1024], real[4096];
    snprintf(p, sizeof p, "/proc/%d/maps", pid);
    if (!realpath(bin, real)) return 0;
    FILE *f = fopen(p, "r");
    uint64_t b = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, off;
        char path[1024] = "";
        if (sscanf(line, "%lx-%*x %*s %lx %*s %*d %1023s", &lo, &off, path) >= 2 && off == 0 &&
            !strcmp(path, real)) {
            b = lo;
            break;
        }
    }
    if (f) fclose(f);
    return b;
}

static int peek(pid_t pid, uint64_t addr, void *buf, size_t n) {
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/mem", pid);
    int fd = open(p, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t r = pread(fd, buf, n, addr);
    close(fd);
    return r == (ssize_t)n ? 0 : -1;
}

static int info(pid_t pid, const char *bin) {
    uint64_t base = base_of(pid, bin);
    if (!base) return fprintf(stderr, "%s not mapped in %d\n", bin, pid), 1;
    struct sym ap = symbol(bin, "__afl_area_ptr"), ms = symbol(bin, "__afl_map_size"),
               ai = symbol(bin, "__afl_area_initial"), fl = symbol(bin, "__afl_final_loc");
    uint64_t ptr = 0;
    uint32_t size = 0, final = 0;
    peek(pid, base + ap.addr, &ptr, 8);
    peek(pid, base + ms.addr, &size, 4);
    peek(pid, base + fl.addr, &final, 4);
    printf("pid %d: base %#lx; __afl_area_ptr %#lx; __afl_area_initial at %#lx (%lu bytes); "
           "__afl_map_size %u; __afl_final_loc %u\n",
           pid, (unsigned long)base, (unsigned long)ptr, (unsigned long)(base + ai.addr), (unsigned long)ai.size,
           size, final);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "grep SYSV /proc/%d/maps", pid);
    fflush(stdout);
    if (system(cmd)) printf("  no SYSV mapping\n");
    return 0;
}

static pid_t ppid_of(pid_t pid) {
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    int fd = open(p, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    int pp = -1;
    if (s) sscanf(s + 2, "%*c %d", &pp);
    return pp;
}

static int comm_is(pid_t pid, const char *name) {
    char p[64], c[32] = "";
    snprintf(p, sizeof p, "/proc/%d/comm", pid);
    int fd = open(p, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, c, sizeof c - 1);
    close(fd);
    if (n > 0 && c[n - 1] == '\n') c[n - 1] = 0;
    return !strcmp(c, name);
}

static pid_t find_fork_server(const char *comm) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && (e = readdir(d))) {
        pid_t pid = atoi(e->d_name);
        if (pid > 0 && comm_is(pid, comm) && comm_is(ppid_of(pid), "afl-fuzz")) found = pid;
    }
    if (d) closedir(d);
    return found;
}

static int attach(const char *comm, const char *bin, const char *var, int seconds, int edge, int sig) {
    struct sym ap = symbol(bin, "__afl_area_ptr"), ms = symbol(bin, "__afl_map_size"), v = symbol(bin, var);
    if (!ap.addr || !v.addr) return fprintf(stderr, "symbols missing in %s\n", bin), 1;
    int stats = stats_map(), bp = -1, prog = -1;
    pid_t fs = 0;
    double t0 = now(), last = t0;
    while (now() - t0 < seconds) {
        if (fs && kill(fs, 0)) {
            printf("%.1f s: fork server %d gone\n", now() - t0, fs);
            close(bp), close(prog), bp = prog = -1, fs = 0;
        }
        if (!fs) {
            pid_t p = find_fork_server(comm);
            uint64_t base = p ? base_of(p, bin) : 0;
            uint64_t ptr = 0;
            uint32_t size = 0;
            // The fork server is up once the map pointer leaves the dummy array.
            if (base && !peek(p, base + ap.addr, &ptr, 8) && !peek(p, base + ms.addr, &size, 4) &&
                !(ptr >= base && ptr < base + 0x1000000) && size) {
                info(p, bin);
                prog_ret = sig;
                prog = feedback_prog(stats, base + v.addr, v.size == 4 ? 4 : 8, base + ap.addr, size, edge,
                                     !sig, 1);
                // With `sig`, the program counts and the handler preloaded
                // into the target writes.
                bp = breakpoint(p, base + v.addr, v.size == 4 ? 4 : 8, 1, prog, sig ? SIGDATA(base + ap.addr, size) : 0);
                if (bp < 0) return 1;
                fs = p;
                printf("%.1f s: fork server %d: breakpoint on %s at %#lx, map size %u, inherited\n", now() - t0, fs,
                       var, (unsigned long)(base + v.addr), size);
                fflush(stdout);
            }
        }
        usleep(fs ? 200000 : 20000);
        if (now() - last >= 10) {
            last = now();
            char w[32];
            snprintf(w, sizeof w, "%.0f s", last - t0);
            print_stats(w, stats);
            fflush(stdout);
        }
    }
    print_stats("end", stats);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, 0, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "self")) return self(argc > 2 ? atol(argv[2]) : 200000);
    if (argc == 4 && !strcmp(argv[1], "info")) return info(atoi(argv[2]), argv[3]);
    if (argc >= 6 && !strcmp(argv[1], "attach"))
        return attach(argv[2], argv[3], argv[4], atoi(argv[5]), argc > 6 && !strcmp(argv[6], "edge"),
                      argc > 6 && !strcmp(argv[6], "signal"));
    fprintf(stderr, "usage: see the comment at the top of %s\n", __FILE__);
    return 2;
}
