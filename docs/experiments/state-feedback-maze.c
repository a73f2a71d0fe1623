// A maze for state-feedback.c: each input byte is a move (byte & 3: up,
// down, left, right); a move into a wall ends the run, reaching E aborts.
// The exit is 22 exact moves from S. The position is stored in the global
// `pos` at every move: the state a breakpoint watches. Edge coverage sees
// only the loop, whatever the position.
//
//   afl-cc -O1 -g docs/experiments/state-feedback-maze.c -o /tmp/maze
//
// With -DSTATE_IN_SOURCE the maze counts its own positions in the map, the
// way IJON does: at each move it increments the byte
// (__afl_map_size - K) + hash(pos) % K of AFL++'s map, K = 256, the same
// hash and bytes as state-feedback-grow.c's handler. Under afl-fuzz the map
// must have been grown by K (AFL_PRELOAD=/tmp/sfg.so) for afl-fuzz to read
// those bytes.
//
//   afl-cc -O1 -g -DSTATE_IN_SOURCE docs/experiments/state-feedback-maze.c \
//       -o /tmp/maze-ijon
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static const char maze[7][10] = {
    "#########",
    "#S  #   #",
    "### # # #",
    "#   # # #",
    "# ### # #",
    "#     #E#",
    "#########",
};

volatile uint64_t pos;  // y * 16 + x

#ifdef STATE_IN_SOURCE
// The instrumentation renames a declaration of __afl_area_ptr in the
// program, so the pointer is looked up by name (it is exported).
#include <dlfcn.h>
extern uint32_t __afl_map_size;
static uint8_t **area_ptr;
#define COUNT_STATE(v)                                                                   \
    do {                                                                                 \
        if (!area_ptr) area_ptr = dlsym(RTLD_DEFAULT, "__afl_area_ptr");                 \
        uint8_t *b_ = *area_ptr + (__afl_map_size - 256) +                               \
                      (((uint64_t)(v) * 0x9E3779B97F4A7C15ull) >> 32) % 256;            \
        *b_ = *b_ + 1 ? *b_ + 1 : 1;                                                     \
    } while (0)
#else
#define COUNT_STATE(v) ((void)0)
#endif

int main(void) {
    unsigned char in[256];
    ssize_t n = read(0, in, sizeof in);
    static const int dy[4] = {-1, 1, 0, 0}, dx[4] = {0, 0, -1, 1};
    int y = 1, x = 1;
    pos = y * 16 + x;
    for (ssize_t i = 0; i < n; i++) {
        int m = in[i] & 3, ny = y + dy[m], nx = x + dx[m];
        if (maze[ny][nx] == '#') return 0;
        y = ny, x = nx;
        pos = y * 16 + x;
        COUNT_STATE(y * 16 + x);
        if (maze[y][x] == 'E') abort();
    }
    return 0;
}
