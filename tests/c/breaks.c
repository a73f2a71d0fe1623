/* The program the DAP code-breakpoint tests launch. main makes a
 * connection record on the heap and hands it to handle_conn, where `c` is
 * a parameter pointing at it (a function breakpoint stops there); that
 * calls set_state, the writer of c->state (a data breakpoint set from the
 * stop catches its store). It prints the result and exits 0.
 * Nothing on this line is code. LINE:no_code */
#include <stdio.h>
#include <stdlib.h>

struct conn {
    int fd;
    int state;
    long bytes;
};

__attribute__((noinline)) void set_state(struct conn *c, int s)
{
    c->state = s; /* LINE:set_state */
}

__attribute__((noinline)) int handle_conn(struct conn *c)
{
    int before = c->state * 10 + c->fd; /* LINE:handle_first */
    c->bytes += before;
    set_state(c, 7); /* LINE:call_set_state */
    return before + c->state;
}

int main(void)
{
    struct conn *c = malloc(sizeof *c);
    if (!c)
        return 1;
    c->fd = 3;
    c->state = 1;
    c->bytes = 0;
    int r = handle_conn(c);
    printf("result %d bytes %ld\n", r, c->bytes);
    free(c);
    return 0;
}
