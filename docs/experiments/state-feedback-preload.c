// The SIGTRAP handler of state-feedback.c as a library to preload into a
// target (afl-fuzz: AFL_PRELOAD=/tmp/sfp.so). At a
// SIGTRAP from a perf event (si_code TRAP_PERF) it reads the 8-byte value at
// si_addr, hashes it, and increments the byte (hash % size) of the map the
// pointer at (si_perf_data & 2^48-1) points to (AFL++'s __afl_area_ptr), of
// size (si_perf_data >> 48) bytes (below 65,536). Other SIGTRAPs are ignored.
//
//   gcc -O2 -shared -fPIC docs/experiments/state-feedback-preload.c -o /tmp/sfp.so
#include <signal.h>
#include <stdint.h>
#include <string.h>

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if (si->si_code != 6 /* TRAP_PERF */) return;
    uint64_t d = *(unsigned long *)((char *)si + 24);  // si_perf_data
    uint8_t *map = *(uint8_t *volatile *)(d & ((1ull << 48) - 1));
    uint32_t size = d >> 48;
    uint64_t v = *(volatile uint64_t *)si->si_addr;
    uint8_t *b = map + ((v * 0x9E3779B97F4A7C15ull) >> 32) % size;
    *b = *b + 1 ? *b + 1 : 1;
}

__attribute__((constructor)) static void init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGTRAP, &sa, 0);
}
