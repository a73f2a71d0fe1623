// A maze for state-feedback.c: each input byte is a move (byte & 3: up,
// down, left, right); a move into a wall ends the run, reaching E aborts.
// The exit is 22 exact moves from S. The position is stored in the global
// `pos` at every move: the state a breakpoint watches. Edge coverage sees
// only the loop, whatever the position.
//
//   afl-cc -O1 -g docs/experiments/state-feedback-maze.c -o /tmp/maze
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
        if (maze[y][x] == 'E') abort();
    }
    return 0;
}
