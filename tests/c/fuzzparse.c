/*
 * fuzzparse: a small record parser with a silent corruption, the fuzzing
 * tests' target. An input is "WP" then two-byte records (kind, value).
 * Kind 'L' sets state.level from the value, and nothing checks that it is
 * at most 100: an input with a larger level corrupts the state without a
 * crash or a sanitizer report. A wpd watchpoint on state.level with the
 * condition "> 100" and the signal action makes that store a crash the
 * fuzzer saves.
 *
 * Built three ways: with afl-cc (a fork server: main reads one input from
 * stdin), with afl-cc -DFUZZ_AFL_PERSISTENT (AFL++'s persistent mode, for
 * wpd-bench) and with clang -fsanitize=fuzzer -DFUZZ_LIBFUZZER
 * (LLVMFuzzerTestOneInput). Compiled with -g so that wpd finds state.level
 * by name. -DFUZZ_ASSERT_LEVEL adds the range check the parser lacks, as
 * an abort(): the crashes wpd's signal action makes, without wpd (the
 * baseline of that action's cost in wpd-bench). -DFUZZ_FORK_STORM makes it a
 * fork server driven by the tests themselves (below).
 */
#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

struct parser_state {
    uint32_t records;
    uint8_t level; /* 0..=100 */
    uint8_t mode;  /* 0..=3 */
    uint16_t flags;
    uint64_t checksum;
};

struct parser_state state;

/* A setting the parser reads and never writes: what a watchpoint that never
 * fires costs a fuzzer (wpd-bench's "fuzzers" section). */
unsigned parser_limit = 100;

static void parse(const uint8_t *data, size_t len) {
    if (len < 2 || data[0] != 'W' || data[1] != 'P')
        return;
    for (size_t i = 2; i + 1 < len; i += 2) {
        uint8_t kind = data[i], value = data[i + 1];
        state.records++;
        switch (kind) {
        case 'L':
            state.level = value; /* the bug: no range check */
#ifdef FUZZ_ASSERT_LEVEL
            if (value > 100)
                abort();
#endif
            if (value > parser_limit)
                state.checksum ^= 1;
            break;
        case 'M':
            state.mode = value & 3;
            break;
        case 'F':
            state.flags |= (uint16_t)(1u << (value & 15));
            break;
        default:
            state.checksum = state.checksum * 31 + value;
        }
    }
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    memset(&state, 0, sizeof state);
    parse(data, len);
    return 0;
}
#elif defined(FUZZ_AFL_PERSISTENT)
/* AFL++'s persistent mode (afl-cc only): the fork server forks once per
 * 10,000 inputs, each read from shared memory by the loop. */
__AFL_FUZZ_INIT();
int main(void) {
    __AFL_INIT();
    const uint8_t *buf = __AFL_FUZZ_TESTCASE_BUF;
    while (__AFL_LOOP(10000)) {
        size_t len = (size_t)__AFL_FUZZ_TESTCASE_LEN;
        memset(&state, 0, sizeof state);
        parse(buf, len);
    }
    return 0;
}
#elif defined(FUZZ_FORK_STORM)
/* A fork server without a fuzzer (the leak test's): for each byte read from
 * stdin, forks argv[1] children one after the other, each of which parses
 * an input that stores a level of 16 and exits; writes "done" once all of
 * them are reaped. */
#include <stdio.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    static const uint8_t input[] = {'W', 'P', 'L', 16};
    long children = argc > 1 ? atol(argv[1]) : 1000;
    char c;
    while (read(0, &c, 1) == 1) {
        for (long i = 0; i < children; i++) {
            pid_t pid = fork();
            if (pid < 0)
                return 1;
            if (pid == 0) {
                parse(input, sizeof input);
                _exit(0);
            }
            if (waitpid(pid, NULL, 0) != pid)
                return 1;
        }
        if (write(1, "done\n", 5) != 5)
            return 1;
    }
    return 0;
}
#else
int main(void) {
    uint8_t buf[4096];
    ssize_t n = read(0, buf, sizeof buf);
    if (n > 0)
        parse(buf, (size_t)n);
    return 0;
}
#endif
