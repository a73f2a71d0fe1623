/* ctyped: globals of every kind a value reads as, for the typed-value
 * tests (tests/e2e/typed.rs): conditions compare as the variable's type
 * does, and values are shown as it reads them.
 *
 * Built by tests/build.rs as `ct-typed` (-g -O0, PIE). It prints one READY
 * line with its pid and the addresses of its variables, then obeys one
 * command per stdin line, answering each with one line:
 *
 *   set NAME V      the main thread stores V into NAME, read as its type:
 *                   refs (long), level (int), temperature (double),
 *                   ratio (float), ready (bool: 0 or 1), phase (enum
 *                   state: a number), cursor (long *: `null`, or I for
 *                   &table[I])                                        -> SET
 *   quit            exits 0                                           -> BYE
 *
 * Each store is one store instruction of the variable's whole width
 * (volatile, -O0).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum state { IDLE, RUNNING, DONE };

volatile long refs;
volatile int level;
volatile double temperature;
volatile float ratio;
volatile bool ready;
volatile enum state phase;
long table[4];
long *volatile cursor;

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("READY pid=%d refs=%p level=%p temperature=%p ratio=%p ready=%p phase=%p "
           "cursor=%p table=%p\n",
           getpid(), (void *)&refs, (void *)&level, (void *)&temperature, (void *)&ratio,
           (void *)&ready, (void *)&phase, (void *)&cursor, (void *)table);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        char name[32], value[64];
        if (sscanf(line, "set %31s %63s", name, value) == 2) {
            if (!strcmp(name, "refs")) {
                refs = strtol(value, NULL, 0);
            } else if (!strcmp(name, "level")) {
                level = (int)strtol(value, NULL, 0);
            } else if (!strcmp(name, "temperature")) {
                temperature = strtod(value, NULL);
            } else if (!strcmp(name, "ratio")) {
                ratio = strtof(value, NULL);
            } else if (!strcmp(name, "ready")) {
                ready = atoi(value) != 0;
            } else if (!strcmp(name, "phase")) {
                phase = (enum state)atoi(value);
            } else if (!strcmp(name, "cursor")) {
                cursor = strcmp(value, "null") ? &table[atoi(value) & 3] : NULL;
            } else {
                puts("ERR unknown variable");
                continue;
            }
            puts("SET");
        } else if (!strncmp(line, "quit", 4)) {
            puts("BYE");
            return 0;
        } else {
            puts("ERR unknown command");
        }
    }
    return 0;
}
