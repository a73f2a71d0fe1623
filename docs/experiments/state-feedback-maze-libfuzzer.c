// The maze of state-feedback-maze.c as a libFuzzer target: each input byte
// is a move (byte & 3: up, down, left, right), a wall ends the input,
// reaching E (22 exact moves) aborts; the position is stored in the global
// `pos` at every move.
//
//   clang-19 -O1 -g -fsanitize=fuzzer
//       docs/experiments/state-feedback-maze-libfuzzer.c (-o /tmp/lfmaze)
//   /tmp/lfmaze -max_total_time=120
//   STATE_FEEDBACK_WATCH=pos LD_PRELOAD=/tmp/sfl.so /tmp/lfmaze ...
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
static const char maze[7][10] = {"#########","#S  #   #","### # # #","#   # # #","# ### # #","#     #E#","#########"};
volatile uint64_t pos;
int LLVMFuzzerTestOneInput(const uint8_t *in, size_t n) {
    static const int dy[4] = {-1, 1, 0, 0}, dx[4] = {0, 0, -1, 1};
    int y = 1, x = 1;
    pos = y * 16 + x;
    for (size_t i = 0; i < n; i++) {
        int m = in[i] & 3, ny = y + dy[m], nx = x + dx[m];
        if (maze[ny][nx] == '#') return 0;
        y = ny, x = nx;
        pos = y * 16 + x;
        if (maze[y][x] == 'E') abort();
    }
    return 0;
}
