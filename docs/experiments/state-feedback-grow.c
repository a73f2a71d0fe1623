// A library to preload into an AFL++ target (afl-fuzz: AFL_PRELOAD) that
// makes room in the coverage map for state feedback and counts a watched
// variable's values there.
//
// Room: AFL++'s runtime sets `__afl_map_size` to the target's edge count N
// (`__afl_final_loc + 1`), then attaches the fuzzer's shm with shmat(), and
// later, in the fork server's handshake, reports `__afl_map_size` to
// afl-fuzz, which then reads that many bytes after each run. This library
// interposes shmat(): at the attach of the map (the shm id in __AFL_SHM_ID)
// it raises `__afl_map_size` from N to N + K before the handshake, so
// afl-fuzz reads N + K bytes and the K bytes after the edges are free.
// `__afl_map_size` is not in the dynamic symbol table of an afl-cc or
// afl-clang-lto executable, so it is found in the .symtab of
// /proc/self/exe (plus the executable's load address). Without a symbol
// table (stripped), the library interposes write() instead and rewrites the
// map size in the handshake itself, the first 4 bytes the fork server
// writes to fd 199, from N to N + K (`__afl_map_size` then stays N in the
// target, which only a persistent-mode target uses, to clear the map).
//
// Feedback: a SIGTRAP from a perf event (si_code TRAP_PERF, a write
// breakpoint opened with sigtrap = 1, e.g. by `state-feedback attach ...
// signal`) makes the handler read the 8-byte value at si_addr, hash it
// ((v * 0x9E3779B97F4A7C15) >> 32) and increment the map byte
// N + hash % K (0 never: 255 + 1 is 1, as AFL++'s counters). Other SIGTRAPs
// are ignored. The map is the address shmat() returned, inherited by the
// fork server's children.
//
// K is 256, or STATE_FEEDBACK_K from the target's environment (1-65536).
// STATE_FEEDBACK_DEBUG=1 prints what was found to stderr.
//
//   gcc -O2 -Wall -shared -fPIC docs/experiments/state-feedback-grow.c
//   (add -o /tmp/sfg.so -ldl)
//   AFL_PRELOAD=/tmp/sfg.so afl-fuzz -i in -o out -- /tmp/maze
//   (afl-fuzz then says "Target map size: N+K")
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

static uint8_t *fb_map;     // the fuzzer's map, once attached
static uint32_t fb_base;    // N: the first byte after the edges
static uint32_t fb_k = 256; // K: bytes for the feedback
static int fb_debug;
static size_t fb_segsz;     // the shm's size
static int fb_grown;        // __afl_map_size raised, or the handshake rewritten

// The run-time address of a symbol of the main executable, from its .symtab.
static void *exe_symbol(const char *name) {
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
                value = sym[j].st_value;
                break;
            }
    }
    int pie = eh->e_type == ET_DYN;
    munmap(img, st.st_size);
    if (!value) return 0;
    // The head of the link map is the main program; l_addr is its load bias.
    struct link_map *lm = 0;
    void *self = dlopen(0, RTLD_NOW);
    if (self) dlinfo(self, RTLD_DI_LINKMAP, &lm);
    return (void *)(value + (pie && lm ? lm->l_addr : 0));
}

void *shmat(int id, const void *addr, int flags) {
    static void *(*real)(int, const void *, int);
    if (!real) real = (void *(*)(int, const void *, int))dlsym(RTLD_NEXT, "shmat");
    void *p = real(id, addr, flags);
    const char *env = getenv("__AFL_SHM_ID");
    if (p == (void *)-1 || fb_map || !env || atoi(env) != id) return p;
    uint32_t *size = dlsym(RTLD_DEFAULT, "__afl_map_size");
    if (!size) size = exe_symbol("__afl_map_size");
    struct shmid_ds ds = {0};
    if (size && !shmctl(id, IPC_STAT, &ds) && *size + (uint64_t)fb_k <= ds.shm_segsz) {
        fb_base = *size;
        *size += fb_k;
        fb_grown = 1;
    }
    fb_map = p;
    fb_segsz = ds.shm_segsz ? ds.shm_segsz : (shmctl(id, IPC_STAT, &ds) ? 0 : ds.shm_segsz);
    if (fb_debug)
        fprintf(stderr, "state-feedback: map %p (%zu bytes), __afl_map_size at %p: edges %u, now %u\n", p,
                (size_t)ds.shm_segsz, (void *)size, fb_base, size ? *size : 0);
    return p;
}

// The fork server's handshake: FS_OPT_ENABLED (0x80000001) and
// FS_OPT_MAPSIZE (0x40000000) set, the map size M as (M - 1) << 1 in bits
// 1-23.
ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    static int seen;
    if (!real) real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (fd != 199 || n != 4 || seen) return real(fd, buf, n);
    seen = 1;
    uint32_t st;
    memcpy(&st, buf, 4);
    if (fb_grown || !fb_map || (st & 0xC0000001u) != 0xC0000001u) return real(fd, buf, n);
    uint32_t m = ((st & 0x00fffffeu) >> 1) + 1;
    if (m + (uint64_t)fb_k > fb_segsz || m + fb_k > 0x800000u) return real(fd, buf, n);
    fb_base = m;
    fb_grown = 1;
    st = (st & ~0x00fffffeu) | ((m + fb_k - 1) << 1);
    if (fb_debug) fprintf(stderr, "state-feedback: handshake map size %u, now %u\n", m, m + fb_k);
    ssize_t r = real(fd, &st, 4);
    return r;
}

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if (si->si_code != 6 /* TRAP_PERF */ || !fb_grown) return;
    uint64_t v = *(volatile uint64_t *)si->si_addr;
    uint8_t *b = fb_map + fb_base + ((v * 0x9E3779B97F4A7C15ull) >> 32) % fb_k;
    *b = *b + 1 ? *b + 1 : 1;
}

__attribute__((constructor)) static void init(void) {
    const char *k = getenv("STATE_FEEDBACK_K");
    if (k && atoi(k) >= 1 && atoi(k) <= 65536) fb_k = atoi(k);
    fb_debug = getenv("STATE_FEEDBACK_DEBUG") != 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGTRAP, &sa, 0);
}
