/* quick: stores `counter` three times at the top of main, then exits: a
 * short program a policy must cover from its first instruction
 * (tests/e2e/policies.rs). With an argument N it lives N ms more after
 * its stores (a run a policy finds after its exec). */
#include <stdlib.h>
#include <unistd.h>

volatile long counter;

int main(int argc, char **argv)
{
    counter = 1;
    counter = 2;
    counter = 3;
    if (argc > 1)
        usleep((useconds_t)atoi(argv[1]) * 1000);
    return 0;
}
