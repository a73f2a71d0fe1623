/*
 * maze: a state machine whose every step runs the same code, the target of
 * the state-feedback tests and benchmarks. An input is up to 32 moves, one
 * per byte (byte & 3: up, down, left, right) from S; a move into a wall
 * kills the walker, who then stays where it is; a walker reaching E aborts
 * there (the crash the fuzzer looks for), the rest of its input unread. E
 * is 22 exact moves from S.
 *
 * Nothing branches on the walk: every input runs the loop once per byte
 * through the same edges, the same number of times for the same length,
 * so edge coverage (and its hit counts) tells a fuzzer nothing about how
 * far a walk got (but for the loop's back edge, taken from the second
 * move on): alone, AFL++ must guess the 22 moves at once (1 in 4^22). The
 * position is stored at every move in the globals `py` then `px` (in that
 * order: at a store to px, py is already the new one), -1 for both once
 * the walker is dead: a watch on px with py is the walk's state. `steps`
 * is stored at every move too: the moves the walker has survived, a
 * number that climbs (a watch with `--feedback max`).
 *
 * Built with afl-cc (a fork server, one input from stdin). With the
 * argument `trace`, prints what each move stored, "py px" per line (the
 * tests replay a fuzzer's saved inputs with it). With -DFUZZ_LIBFUZZER
 * (clang -fsanitize=fuzzer) the walk is libFuzzer's target instead. With
 * -DEND_MID_INPUT a walker that dies ends the process at once (_exit(0),
 * the rest of its input unread): runs that end mid-input. With
 * -DPERSISTENT (afl-cc) the walk runs in AFL++'s persistent mode: one
 * process walks input after input from shared memory. With
 * -DSTATE_IN_SOURCE the position is counted in AFL++'s map by the program
 * itself, in the bytes and with the key wpd's library uses (IJON's way: one
 * line in the source; the benchmark's floor): it must run with the library
 * preloaded (its room in the map), and exports the count for the library
 * to take.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One corridor, no loop and no branch: its 22 moves (down, right, down,
   down, left, down, down, right, right, down, right, right, up, up, right,
   up, up, left, up, up, left, left) do not repeat themselves, so no part of
   a walk completes another by being copied (a fuzzer's block copies and
   splices do that to a periodic path), and a walk reaches
   the exit once in 4 * 10^12 (32 random moves). */
static const char maze[9][9] = {
    "########",
    "#S#E  ##",
    "#  ## ##",
    "## ##  #",
    "#  ### #",
    "# ###  #",
    "#   # ##",
    "###   ##",
    "########",
};

volatile int64_t px, py, steps;

#ifdef STATE_IN_SOURCE
/* The library's in-source entry: counts (v, w) as a feedback trap of the
   given mode and tag would. */
extern void wpd_feedback_count(uint64_t v, uint64_t w, uint32_t mode, uint32_t tag);
#define COUNT_STATE(x, y) wpd_feedback_count((uint64_t)(x), (uint64_t)(y), 0, 1)
#else
#define COUNT_STATE(x, y) ((void)0)
#endif

/* Walks the moves of `in`; 1 if the walker reached the exit. */
static int walk(const unsigned char *in, size_t n, int trace) {
    static const int dy[4] = {-1, 1, 0, 0}, dx[4] = {0, 0, -1, 1};
    int y = 1, x = 1, alive = 1, moves = 0;
    for (size_t i = 0; i < n && i < 32; i++) {
        int m = in[i] & 3;
        int ny = y + dy[m], nx = x + dx[m];
        int open = maze[ny][nx] != '#';
        alive &= open;
        y += (ny - y) * alive;
        x += (nx - x) * alive;
        py = y * alive - !alive;
        px = x * alive - !alive;
        moves += alive;
        steps = moves;
        COUNT_STATE(px, py);
        if (trace)
            printf("%lld %lld\n", (long long)py, (long long)px);
#ifdef END_MID_INPUT
        if (!alive)
            _exit(0);
#endif
        if (alive & (maze[y][x] == 'E'))
            return 1;
    }
    return 0;
}

#if defined(PERSISTENT)
__AFL_FUZZ_INIT();

int main(void) {
    __AFL_INIT();
    const unsigned char *buf = __AFL_FUZZ_TESTCASE_BUF;
    while (__AFL_LOOP(100000)) {
        size_t n = __AFL_FUZZ_TESTCASE_LEN;
        if (walk(buf, n, 0))
            abort();
    }
    return 0;
}
#elif defined(FUZZ_LIBFUZZER)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (walk(data, size, 0))
        abort();
    return 0;
}
#else
int main(int argc, char **argv) {
    unsigned char in[32];
    int trace = argc > 1 && strcmp(argv[1], "trace") == 0;
    if (trace)
        setvbuf(stdout, NULL, _IONBF, 0); /* each line out before an abort */
    ssize_t n = read(0, in, sizeof in);
    if (walk(in, n > 0 ? (size_t)n : 0, trace))
        abort();
    return 0;
}
#endif
