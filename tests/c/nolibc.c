/* nolibc: a program no dynamic linker runs and no C library is linked
 * into (-static -nostdlib), so it has no dynamic linker's debugger hook
 * (_dl_debug_state) for pending code events to wait at. Prints
 * "READY pid=N", then reads stdin to its end and exits. System calls are
 * made directly (x86-64).
 */
static long sys3(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return r;
}

__attribute__((force_align_arg_pointer, noreturn)) void _start(void)
{
    char line[32] = {'R', 'E', 'A', 'D', 'Y', ' ', 'p', 'i', 'd', '='};
    int len = 10;
    long pid = sys3(39 /* getpid */, 0, 0, 0);
    char digits[20];
    int n = 0;
    do {
        digits[n++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (n > 0)
        line[len++] = digits[--n];
    line[len++] = '\n';
    sys3(1 /* write */, 1, (long)line, len);
    char c;
    while (sys3(0 /* read */, 0, (long)&c, 1) > 0) {
    }
    for (;;)
        sys3(60 /* exit */, 0, 0, 0);
}
