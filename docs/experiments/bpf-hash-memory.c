// What a BPF hash map costs the kernel, preallocated or not.
//
// Creates 20 BPF_MAP_TYPE_HASH maps (8-byte keys, 40-byte values: a code
// event's set of live objects) of 65,536, 4,096 and 256 entries, with and
// without BPF_F_NO_PREALLOC, and prints the `memlock` the kernel reports in
// the first map's fdinfo, at creation and after 100 entries, and the growth
// of VmallocUsed per map.
//
//   gcc -O2 -Wall docs/experiments/bpf-hash-memory.c -o /tmp/bpf-hash-memory
//   /tmp/bpf-hash-memory
//
// Root only. (A negative VmallocUsed growth: the previous maps' memory was
// freed meanwhile.)
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

// A number after `key` in a line of `path`.
static long field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
    if (f) fclose(f);
    return v;
}

static long memlock(int fd) {
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fdinfo/%d", fd);
    return field(p, "memlock:");
}

static int create(int max, int flags) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_HASH;
    a.key_size = 8;
    a.value_size = 40;
    a.max_entries = max;
    a.map_flags = flags;
    return syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof a);
}

static int insert(int fd, uint64_t k) {
    uint64_t v[5] = {0};
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = fd;
    a.key = (uint64_t)&k;
    a.value = (uint64_t)v;
    return syscall(SYS_bpf, BPF_MAP_UPDATE_ELEM, &a, sizeof a);
}

int main(void) {
    int sizes[] = {65536, 4096, 256};
    for (int noprealloc = 0; noprealloc < 2; noprealloc++) {
        for (int m = 0; m < 3; m++) {
            long before = field("/proc/meminfo", "VmallocUsed:");
            int fds[20];
            for (int i = 0; i < 20; i++) fds[i] = create(sizes[m], noprealloc ? BPF_F_NO_PREALLOC : 0);
            if (fds[0] < 0) {
                perror("BPF_MAP_CREATE");
                return 1;
            }
            long after = field("/proc/meminfo", "VmallocUsed:");
            long at_creation = memlock(fds[0]);
            for (int k = 0; k < 100; k++) insert(fds[0], k);
            printf("max %6d no-prealloc %d: memlock %8ld (after 100 entries %8ld), vmalloc per map %ld KiB\n",
                   sizes[m], noprealloc, at_creation, memlock(fds[0]), (after - before) / 20);
            for (int i = 0; i < 20; i++) close(fds[i]);
        }
    }
    return 0;
}
