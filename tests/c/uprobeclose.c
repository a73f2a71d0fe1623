// What closing a uprobe perf event costs, and whether closes overlap.
//
// Opens N uprobes on libc's `free` of a sleeping child process, each with
// a BPF program (BPF_PROG_TYPE_KPROBE, `r0 = 0; exit`), then closes them:
// one after another on one thread, or spread over T threads that close
// theirs at once. MODE says how a probe is made:
//   0  a uprobe perf event (the uprobe PMU, cpu -1), no program
//   1  a uprobe perf event with the program (PERF_EVENT_IOC_SET_BPF)
//   2  a BPF link of one uprobe each (BPF_LINK_CREATE, BPF_TRACE_UPROBE_MULTI,
//      the child's pid as its filter)
//   3  one BPF link of all N uprobes (T is then ignored)
//
//   gcc -O2 -pthread tests/c/uprobeclose.c -o /tmp/uprobe-close
//   /tmp/uprobe-close N T MODE     # e.g. 100 1 1, 100 100 1, 100 1 2, 100 100 2, 100 1 3
//
// Prints the time to open and to close, and the mean close per probe. Root only.
// tests/build.rs builds it as `ct-uprobeclose`: the floor of wpd-bench's
// `closes` section.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// The file and file offset of the function at `addr`, from /proc/self/maps.
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

// enum bpf_attach_type's BPF_TRACE_UPROBE_MULTI (Linux 6.6; older headers lack it).
#define TRACE_UPROBE_MULTI 48
#define LINK_CREATE 28

static int load_prog(int multi) {
    struct bpf_insn insns[] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 0, .imm = 0},
        {.code = BPF_JMP | BPF_EXIT},
    };
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_KPROBE;
    a.insns = (uint64_t)insns;
    a.insn_cnt = 2;
    a.license = (uint64_t)"GPL";
    if (multi) a.expected_attach_type = TRACE_UPROBE_MULTI;
    return syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
}

// A BPF link of `n` uprobes at `offs` of `path`, for process `pid` only.
static int link_uprobes(int prog, const char *path, uint64_t *offs, int n, pid_t pid) {
    // union bpf_attr's link_create: prog_fd, target_fd, attach_type, flags,
    // then uprobe_multi { path, offsets, ref_ctr_offsets, cookies, cnt, flags, pid }.
    uint64_t a[16];
    memset(a, 0, sizeof a);
    uint32_t *w = (uint32_t *)a;
    w[0] = prog;
    w[2] = TRACE_UPROBE_MULTI;
    a[2] = (uint64_t)path;
    a[3] = (uint64_t)offs;
    w[12] = n;
    w[14] = pid;
    return syscall(SYS_bpf, LINK_CREATE, a, sizeof a);
}

static int *fds;
static int nfds, nthreads;

static void *closer(void *arg) {
    long t = (long)arg;
    for (int i = t; i < nfds; i += nthreads) close(fds[i]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s N THREADS MODE(0-3)\n", argv[0]);
        return 2;
    }
    nfds = atoi(argv[1]);
    nthreads = atoi(argv[2]);
    int mode = atoi(argv[3]);
    char path[256];
    uint64_t off;
    if (file_offset(dlsym(RTLD_DEFAULT, "free"), path, sizeof path, &off)) return 1;
    FILE *t = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int type;
    if (!t || fscanf(t, "%d", &type) != 1) return 1;
    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    int prog = mode ? load_prog(mode >= 2) : -1;
    if (mode && prog < 0) {
        perror("BPF_PROG_LOAD");
        return 1;
    }
    fds = calloc(nfds, sizeof *fds);
    double t0 = now();
    if (mode == 3) {
        uint64_t *offs = calloc(nfds, sizeof *offs);
        for (int i = 0; i < nfds; i++) offs[i] = off;
        fds[0] = link_uprobes(prog, path, offs, nfds, child);
        if (fds[0] < 0) {
            perror("BPF_LINK_CREATE");
            return 1;
        }
        nfds = 1;
        nthreads = 1;
    }
    for (int i = 0; mode != 3 && i < nfds; i++) {
        if (mode == 2) {
            fds[i] = link_uprobes(prog, path, &off, 1, child);
            if (fds[i] < 0) {
                perror("BPF_LINK_CREATE");
                return 1;
            }
            continue;
        }
        struct perf_event_attr a;
        memset(&a, 0, sizeof a);
        a.size = sizeof a;
        a.type = type;
        a.config1 = (uint64_t)path;
        a.config2 = off;
        a.sample_period = 1;
        fds[i] = syscall(SYS_perf_event_open, &a, child, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fds[i] < 0) {
            perror("perf_event_open");
            return 1;
        }
        if (mode == 1 && ioctl(fds[i], PERF_EVENT_IOC_SET_BPF, prog)) {
            perror("SET_BPF");
            return 1;
        }
    }
    double t1 = now();
    pthread_t th[1024];
    if (nthreads > 1024) nthreads = 1024;
    for (long i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, closer, (void *)i);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    double t2 = now();
    printf("probes %d threads %d mode %d: open %.1f ms, close %.1f ms (%.2f ms per probe)\n", nfds,
           nthreads, mode, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t2 - t1) * 1e3 / nfds);
    // (mode 3: one link, so "per probe" is per link)
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
