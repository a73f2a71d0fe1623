/* The program the DAP tests launch: its first statement stores into
 * `early` (so only a data breakpoint armed before main runs sees it), then
 * it prints its arguments, WPD_LAUNCH_VAR and its directory, and exits with the code its
 * first argument names. Its globals are what the Globals scope shows. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

long early;

struct limits {
    int soft;
    long hard;
    struct {
        short lo;
        short hi;
    } range;
};

struct limits g_limits = {3, 1000, {-2, 9}};
int g_table[4] = {10, 20, 30, 40};
const char *g_name = "launched";
static int g_calls = 5;

int main(int argc, char **argv)
{
    early = 42;
    g_calls++;
    printf("launched argc=%d", argc);
    for (int i = 1; i < argc; i++)
        printf(" [%s]", argv[i]);
    const char *v = getenv("WPD_LAUNCH_VAR");
    char cwd[512];
    printf(" WPD_LAUNCH_VAR=%s cwd=%s\n", v ? v : "(unset)",
           getcwd(cwd, sizeof cwd) ? cwd : "?");
    fprintf(stderr, "to stderr\n");
    return argc > 1 ? atoi(argv[1]) : 0;
}
