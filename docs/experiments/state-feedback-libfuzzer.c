// State feedback for a libFuzzer target, as a library to preload.
//
// A libFuzzer binary (clang -fsanitize=fuzzer) exports
// __sanitizer_cov_8bit_counters_init and __sanitizer_cov_pcs_init in its
// dynamic symbol table: the calls an instrumented module makes to register
// its 8-bit counters and its PC table. This library registers a module of
// its own, K = 256 counters with a table of K made-up PCs, from its
// constructor, so libFuzzer counts these bytes as features like the
// program's edges. (The other region libFuzzer reads, the section
// __libfuzzer_extra_counters, exists only if the program defines it: in
// a program that does not, __start___libfuzzer_extra_counters is an
// undefined weak symbol.)
//
// A SIGTRAP from a perf event (si_code TRAP_PERF) makes the handler read
// the 8-byte value at si_addr and increment counter
// ((v * 0x9E3779B97F4A7C15) >> 32) % K. With STATE_FEEDBACK_WATCH=NAME in
// the environment the library itself opens the write breakpoint, with
// sigtrap = 1, on the main thread, on the program's global NAME (found in
// the .symtab of /proc/self/exe): libFuzzer runs its inputs in that thread.
// Whoever opens the breakpoint (wpd or this library), the counting is the
// handler's.
//
//   clang-19 -O1 -g -fsanitize=fuzzer
//       docs/experiments/state-feedback-maze-libfuzzer.c (-o /tmp/lfmaze)
//   gcc -O2 -Wall -shared -fPIC docs/experiments/state-feedback-libfuzzer.c
//   (add -o /tmp/sfl.so -ldl)
//   STATE_FEEDBACK_WATCH=pos LD_PRELOAD=/tmp/sfl.so /tmp/lfmaze
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define K 256
static uint8_t counters[K] __attribute__((aligned(64)));
static uintptr_t pcs[2 * K];  // (pc, flags) pairs

static void *exe_symbol(const char *name, uint64_t *size) {
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    void *img = MAP_FAILED;
    if (!fstat(fd, &st)) img = mmap(0, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (img == MAP_FAILED) return 0;
    const Elf64_Ehdr *eh = img;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)((char *)img + eh->e_shoff);
    uint64_t value = 0;
    for (int i = 0; i < eh->e_shnum && !value; i++) {
        if (sh[i].sh_type != SHT_SYMTAB) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)((char *)img + sh[i].sh_offset);
        const char *str = (const char *)img + sh[sh[i].sh_link].sh_offset;
        for (size_t j = 0; j < sh[i].sh_size / sizeof *sym; j++)
            if (sym[j].st_name && !strcmp(str + sym[j].st_name, name)) {
                value = sym[j].st_value, *size = sym[j].st_size;
                break;
            }
    }
    int pie = eh->e_type == ET_DYN;
    munmap(img, st.st_size);
    if (!value) return 0;
    struct link_map *lm = 0;
    void *self = dlopen(0, RTLD_NOW);
    if (self) dlinfo(self, RTLD_DI_LINKMAP, &lm);
    return (void *)(value + (pie && lm ? lm->l_addr : 0));
}

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if (si->si_code != 6 /* TRAP_PERF */) return;
    uint64_t v = *(volatile uint64_t *)si->si_addr;
    uint8_t *b = counters + ((v * 0x9E3779B97F4A7C15ull) >> 32) % K;
    *b = *b + 1 ? *b + 1 : 1;
}

__attribute__((constructor)) static void init(void) {
    void (*cinit)(uint8_t *, uint8_t *) = (void (*)(uint8_t *, uint8_t *))dlsym(
        RTLD_DEFAULT, "__sanitizer_cov_8bit_counters_init");
    void (*pinit)(const uintptr_t *, const uintptr_t *) = (void (*)(const uintptr_t *, const uintptr_t *))dlsym(
        RTLD_DEFAULT, "__sanitizer_cov_pcs_init");
    if (!cinit || !pinit) return;
    for (int i = 0; i < K; i++) pcs[2 * i] = (uintptr_t)&counters[i];
    cinit(counters, counters + K);
    pinit(pcs, pcs + 2 * K);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGTRAP, &sa, 0);

    const char *watch = getenv("STATE_FEEDBACK_WATCH");
    uint64_t size = 0;
    void *addr = watch ? exe_symbol(watch, &size) : 0;
    if (!addr) return;
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.bp_type = HW_BREAKPOINT_W;
    a.bp_addr = (uintptr_t)addr;
    a.bp_len = size == 4 ? HW_BREAKPOINT_LEN_4 : HW_BREAKPOINT_LEN_8;
    a.sample_period = 1;
    a.exclude_kernel = 1, a.exclude_hv = 1;
    a.sigtrap = 1, a.remove_on_exec = 1, a.sig_data = 1;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) perror("state-feedback: perf_event_open");
    else if (getenv("STATE_FEEDBACK_DEBUG"))
        fprintf(stderr, "state-feedback: breakpoint on %s at %p\n", watch, addr);
}
