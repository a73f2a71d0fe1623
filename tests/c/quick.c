/* quick: stores `counter` three times at the top of main, then exits: a
 * short program a policy by executable must cover from its first
 * instruction (tests/e2e/policies.rs). */
volatile long counter;

int main(void)
{
    counter = 1;
    counter = 2;
    counter = 3;
    return 0;
}
