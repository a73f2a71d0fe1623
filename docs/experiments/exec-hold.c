// Holding a process at exec before its first instruction, with fanotify
// FAN_OPEN_EXEC_PERM and ptrace, and what it costs (kernel-facts §23).
//
// The program writes a tiny static ELF target (no libc: its entry point's
// first instruction stores 2 into a global initialised to 1, then it exits
// with status 7) and a second copy of it, on a tmpfs of its own mounted in a
// private mount namespace (so a filesystem-wide mark sees only these
// execs). A separate listener process (a child of this one, as a daemon
// would be) answers the permission events. This process is the target's
// parent: fork, execve, waitpid(WUNTRACED | WCONTINUED), counting any stop
// or continue it is told of. Parts:
//   check   listener marks the target's inode; on its event it
//           PTRACE_SEIZEs the execing pid with PTRACE_O_TRACEEXEC, allows,
//           waits for the PTRACE_EVENT_EXEC stop, reads rip, the global
//           (/proc/PID/mem) and /proc/PID/exe there, then PTRACE_DETACHes
//   cost    exec-to-exit of the target, in rounds, each mode in turn:
//             a  no listener
//             b  the target's inode marked, held + seized + detached
//             c  the other copy's inode marked (target not matching)
//             d  the tmpfs marked (FAN_MARK_FILESYSTEM); each event's path
//                read (readlink of its fd) and compared with a name that
//                does not match, then allowed at once
//   death   listener SIGKILLed while the target is (i) blocked in the
//           permission event, (ii) in the PTRACE_EVENT_EXEC stop; and a
//           target sent SIGTERM / SIGKILL while blocked in the event
//
//   gcc -O2 docs/experiments/exec-hold.c -o /tmp/exec-hold
//   /tmp/exec-hold 2000 20      # execs per cost mode, tries per death case
//
// Root only (fanotify permission events, ptrace, mount). Everything it
// starts is killed and reaped, its tmpfs unmounted, before it exits.
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BASE 0x400000UL
#define ENTRY (BASE + 120)
#define FLAG (BASE + 144)

static char dir[64], target[96], other[96];

static void die(const char *what)
{
    perror(what);
    exit(1);
}

// ELF header, one RWX PT_LOAD of the whole file, code at 120, flag at 144.
static void write_target(const char *path)
{
    unsigned char img[152] = {0};
    Elf64_Ehdr *eh = (Elf64_Ehdr *)img;
    Elf64_Phdr *ph = (Elf64_Phdr *)(img + 64);
    static const unsigned char code[] = {
        0x48, 0xc7, 0x05, 0x0d, 0x00, 0x00, 0x00, 0x02, 0, 0, 0, // movq $2,flag
        0xb8, 0x3c, 0x00, 0x00, 0x00,                           // mov $60,%eax
        0xbf, 0x07, 0x00, 0x00, 0x00,                           // mov $7,%edi
        0x0f, 0x05,                                             // syscall
    };
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_ident[EI_VERSION] = EV_CURRENT;
    eh->e_type = ET_EXEC;
    eh->e_machine = EM_X86_64;
    eh->e_version = EV_CURRENT;
    eh->e_entry = ENTRY;
    eh->e_phoff = 64;
    eh->e_ehsize = 64;
    eh->e_phentsize = sizeof(Elf64_Phdr);
    eh->e_phnum = 1;
    ph->p_type = PT_LOAD;
    ph->p_flags = PF_R | PF_W | PF_X;
    ph->p_vaddr = ph->p_paddr = BASE;
    ph->p_filesz = ph->p_memsz = sizeof img;
    ph->p_align = 0x1000;
    memcpy(img + 120, code, sizeof code);
    img[144] = 1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (fd < 0 || write(fd, img, sizeof img) != sizeof img || close(fd))
        die(path);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static char proc_state(pid_t pid)
{
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    int fd = open(p, O_RDONLY);
    if (fd < 0)
        return '?';
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return '?';
    buf[n] = 0;
    char *r = strrchr(buf, ')');
    return r && r[1] && r[2] ? r[2] : '?';
}

static void comm_of(pid_t pid, char *out, size_t len)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/comm", pid);
    int fd = open(p, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, out, len - 1);
    if (fd >= 0)
        close(fd);
    out[n > 0 ? n - 1 : 0] = 0;
}

static void exe_of(pid_t pid, char *out, size_t len)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/exe", pid);
    ssize_t n = readlink(p, out, len - 1);
    out[n > 0 ? n : 0] = 0;
}

// ---------------------------------------------------------------- listener

enum mode { L_HOLD, L_OTHER, L_FS, L_CHECK, L_DIE_PERM, L_DIE_STOP, L_FS_IGN };

struct check {
    pid_t pid;
    char state_at_event;      // the execing task's state while it waits
    int exe_old_at_event;     // /proc/PID/exe still the parent's image
    int stop_ok;              // the stop is PTRACE_EVENT_EXEC
    unsigned long rip;        // at the stop
    long flag;                // the global at the stop
    int exe_new_at_stop;      // /proc/PID/exe is the target at the stop
    double held_us;           // event read to detach
    char path_at_event[96];   // readlink of the event's fd
    char comm_at_event[16], comm_at_stop[16];
};

static void reply(int fan, int fd, unsigned resp)
{
    struct fanotify_response r = {.fd = fd, .response = resp};
    if (write(fan, &r, sizeof r) != sizeof r)
        die("fanotify response");
}

static int seize_allow_wait(int fan, int fd, pid_t pid)
{
    int st;
    if (ptrace(PTRACE_SEIZE, pid, 0, PTRACE_O_TRACEEXEC))
        die("PTRACE_SEIZE");
    reply(fan, fd, FAN_ALLOW);
    if (waitpid(pid, &st, __WALL) != pid)
        die("waitpid tracee");
    return WIFSTOPPED(st) && st >> 8 == (SIGTRAP | PTRACE_EVENT_EXEC << 8);
}

static long peek_flag(pid_t pid)
{
    char p[64];
    long v = -1;
    snprintf(p, sizeof p, "/proc/%d/mem", pid);
    int fd = open(p, O_RDONLY);
    if (fd < 0 || pread(fd, &v, sizeof v, FLAG) != sizeof v)
        v = -1;
    if (fd >= 0)
        close(fd);
    return v;
}

static void listener(enum mode m, int ready, int report)
{
    int fan = fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC,
                            O_RDONLY | O_LARGEFILE | O_CLOEXEC);
    if (fan < 0)
        die("fanotify_init");
    int fs = m == L_FS || m == L_FS_IGN;
    const char *what = m == L_OTHER ? other : fs ? dir : target;
    unsigned flags = FAN_MARK_ADD | (fs ? FAN_MARK_FILESYSTEM : 0);
    if (fanotify_mark(fan, flags, FAN_OPEN_EXEC_PERM, AT_FDCWD, what))
        die("fanotify_mark");
    // the target's inode known not to match: an ignore mask on it
    if (m == L_FS_IGN &&
        fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_IGNORED_MASK |
                               FAN_MARK_IGNORED_SURV_MODIFY,
                      FAN_OPEN_EXEC_PERM, AT_FDCWD, target))
        die("fanotify_mark ignore");
    char parent_exe[256];
    exe_of(getppid(), parent_exe, sizeof parent_exe);
    if (write(ready, "r", 1) != 1)
        die("ready");
    char buf[4096] __attribute__((aligned(8)));
    for (;;) {
        ssize_t n = read(fan, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("read fanotify");
        struct fanotify_event_metadata *e = (void *)buf;
        for (; FAN_EVENT_OK(e, n); e = FAN_EVENT_NEXT(e, n)) {
            double t0 = now_us();
            pid_t pid = e->pid;
            if (m == L_FS || m == L_FS_IGN) {
                // a --comm policy: the name the new image will have
                char p[64], path[512];
                snprintf(p, sizeof p, "/proc/self/fd/%d", e->fd);
                ssize_t k = readlink(p, path, sizeof path - 1);
                path[k > 0 ? k : 0] = 0;
                const char *base = strrchr(path, '/');
                base = base ? base + 1 : path;
                reply(fan, e->fd, FAN_ALLOW); // "nomatch" never matches
                (void)(strcmp(base, "nomatch") == 0);
            } else if (m == L_HOLD) {
                if (!seize_allow_wait(fan, e->fd, pid))
                    die("not an exec stop");
                (void)peek_flag(pid); // stands for arming
                ptrace(PTRACE_DETACH, pid, 0, 0);
            } else if (m == L_CHECK) {
                struct check c = {.pid = pid};
                char exe[256];
                c.state_at_event = proc_state(pid);
                char p[64];
                snprintf(p, sizeof p, "/proc/self/fd/%d", e->fd);
                ssize_t k = readlink(p, c.path_at_event,
                                     sizeof c.path_at_event - 1);
                c.path_at_event[k > 0 ? k : 0] = 0;
                comm_of(pid, c.comm_at_event, sizeof c.comm_at_event);
                exe_of(pid, exe, sizeof exe);
                c.exe_old_at_event = strcmp(exe, parent_exe) == 0;
                c.stop_ok = seize_allow_wait(fan, e->fd, pid);
                struct user_regs_struct r;
                ptrace(PTRACE_GETREGS, pid, 0, &r);
                c.rip = r.rip;
                c.flag = peek_flag(pid);
                exe_of(pid, exe, sizeof exe);
                c.exe_new_at_stop = strcmp(exe, target) == 0;
                comm_of(pid, c.comm_at_stop, sizeof c.comm_at_stop);
                ptrace(PTRACE_DETACH, pid, 0, 0);
                c.held_us = now_us() - t0;
                if (write(report, &c, sizeof c) != sizeof c)
                    die("report");
            } else if (m == L_DIE_PERM) {
                if (write(report, &pid, sizeof pid) != sizeof pid)
                    die("report");
                for (;;)
                    pause(); // never answers
            } else if (m == L_DIE_STOP) {
                if (!seize_allow_wait(fan, e->fd, pid))
                    die("not an exec stop");
                if (write(report, &pid, sizeof pid) != sizeof pid)
                    die("report");
                for (;;)
                    pause(); // never detaches
            }
            close(e->fd);
        }
    }
}

struct lst {
    pid_t pid;
    int report; // read end
};

static struct lst start_listener(enum mode m)
{
    int rp[2], pp[2];
    char c;
    if (pipe2(rp, O_CLOEXEC) || pipe2(pp, O_CLOEXEC))
        die("pipe");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(rp[0]);
        close(pp[0]);
        listener(m, rp[1], pp[1]);
        _exit(0);
    }
    close(rp[1]);
    close(pp[1]);
    if (read(rp[0], &c, 1) != 1)
        die("listener not ready");
    close(rp[0]);
    return (struct lst){pid, pp[0]};
}

static void stop_listener(struct lst *l)
{
    kill(l->pid, SIGKILL);
    waitpid(l->pid, NULL, 0);
    close(l->report);
}

static int read_timed(int fd, void *p, size_t len, int ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, ms) != 1)
        return -1;
    return read(fd, p, len) == (ssize_t)len ? 0 : -1;
}

// ------------------------------------------------------------------ parent

static pid_t spawn(const char *path)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        char *argv[] = {(char *)path, NULL};
        execve(path, argv, environ);
        _exit(127);
    }
    return pid;
}

static int visible; // stops or continues the parent was told of

// Waits as a shell would; returns the exit status, or -1 if killed by a
// signal (its number in *sig), or -2 on timeout (ms > 0).
static int wait_child(pid_t pid, int ms, int *sig)
{
    double end = now_us() + ms * 1000.0;
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WUNTRACED | WCONTINUED | (ms ? WNOHANG : 0));
        if (r == pid) {
            if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
                visible++;
                continue;
            }
            if (WIFEXITED(st))
                return WEXITSTATUS(st);
            if (sig)
                *sig = WTERMSIG(st);
            return -1;
        }
        if (r < 0)
            die("waitpid");
        if (now_us() > end)
            return -2;
        usleep(200);
    }
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void loadavg(const char *when)
{
    char b[128] = {0};
    int fd = open("/proc/loadavg", O_RDONLY);
    if (fd >= 0 && read(fd, b, sizeof b - 1) > 0)
        printf("load average %s: %s", when, b);
    if (fd >= 0)
        close(fd);
}

static void part_check(int tries)
{
    int ok_stop = 0, ok_rip = 0, ok_flag = 0, ok_old = 0, ok_new = 0;
    int ok_exit = 0;
    char states[8] = {0};
    int nstates = 0;
    double held[tries];
    struct lst l = start_listener(L_CHECK);
    visible = 0;
    for (int i = 0; i < tries; i++) {
        struct check c;
        pid_t pid = spawn(target);
        if (read_timed(l.report, &c, sizeof c, 5000))
            die("check: no report");
        ok_stop += c.stop_ok;
        ok_rip += c.rip == ENTRY;
        ok_flag += c.flag == 1;
        ok_old += c.exe_old_at_event;
        ok_new += c.exe_new_at_stop;
        held[i] = c.held_us;
        if (!memchr(states, c.state_at_event, nstates) && nstates < 7)
            states[nstates++] = c.state_at_event;
        if (i == 0)
            printf("check: pid %d, state at event %c, rip at stop %#lx "
                   "(entry %#lx), flag at stop %ld\n",
                   c.pid, c.state_at_event, c.rip, ENTRY, c.flag);
        ok_exit += wait_child(pid, 0, NULL) == 7;
    }
    // the name the event shows, and the task's comm, for an exec through
    // a symlink of another name
    char link[128];
    snprintf(link, sizeof link, "%s/a-longer-link-name", dir);
    if (symlink(target, link))
        die("symlink");
    struct check c;
    pid_t pid = spawn(link);
    if (read_timed(l.report, &c, sizeof c, 5000))
        die("check: no report");
    ok_exit += wait_child(pid, 0, NULL) == 7;
    printf("check: exec of %s: event fd path %s, comm at event '%s', "
           "comm at exec stop '%s', rip == entry %d, flag %ld\n",
           link, c.path_at_event, c.comm_at_event, c.comm_at_stop,
           c.rip == ENTRY, c.flag);
    unlink(link);
    stop_listener(&l);
    qsort(held, tries, sizeof *held, cmpd);
    printf("check: %d tries: exec-event stop %d, rip == entry %d, flag still "
           "1 %d, exe old at event %d, exe new at stop %d, exit 7 %d/%d, "
           "states at event '%s', stops/continues seen by parent %d, "
           "held p50 %.0f us\n",
           tries, ok_stop, ok_rip, ok_flag, ok_old, ok_new, ok_exit, tries + 1,
           states,
           visible, held[tries / 2]);
}

static void part_cost(int n)
{
    const char *names[] = {"a none", "b held", "c other marked",
                           "d fs mark, allowed", "e fs mark, ignored"};
    const enum mode lm[] = {0, L_HOLD, L_OTHER, L_FS, L_FS_IGN};
    const int M = 5;
    const int rounds = 10, per = n / rounds;
    double *t[5];
    int bad[5] = {0}, vis[5] = {0};
    for (int m = 0; m < M; m++)
        t[m] = calloc(rounds * per, sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < M; m++) {
            struct lst l = {0};
            if (m)
                l = start_listener(lm[m]);
            visible = 0;
            for (int i = 0; i < per; i++) {
                double t0 = now_us();
                pid_t pid = spawn(target);
                bad[m] += wait_child(pid, 0, NULL) != 7;
                t[m][r * per + i] = now_us() - t0;
            }
            vis[m] += visible;
            if (m)
                stop_listener(&l);
        }
    int k = rounds * per;
    for (int m = 0; m < M; m++)
        qsort(t[m], k, sizeof(double), cmpd);
    double a50 = t[0][k / 2], a99 = t[0][k * 99 / 100];
    for (int m = 0; m < M; m++) {
        double p50 = t[m][k / 2], p99 = t[m][k * 99 / 100];
        printf("cost %-20s n %d  p50 %7.1f us  p99 %7.1f us  x%.2f / x%.2f"
               "  bad exits %d  stops seen %d\n",
               names[m], k, p50, p99, p50 / a50, p99 / a99, bad[m], vis[m]);
        free(t[m]);
    }
}

// kind 0: listener killed at the event; 1: at the exec stop;
// 2: target sent SIGTERM at the event; 3: SIGKILL at the event
static void part_death(int kind, int tries)
{
    const char *names[] = {"killed in perm event", "killed in exec stop",
                           "SIGTERM to held target", "SIGKILL to held target"};
    int ran = 0, stuck = 0, other = 0, quiet = 0, alive_before = 0;
    char states[8] = {0};
    int nstates = 0;
    double after[tries];
    visible = 0;
    for (int i = 0; i < tries; i++) {
        struct lst l = start_listener(kind == 1 ? L_DIE_STOP : L_DIE_PERM);
        pid_t pid = spawn(target), got;
        if (read_timed(l.report, &got, sizeof got, 5000) || got != pid)
            die("death: no report");
        usleep(20000);
        char s = proc_state(pid);
        if (!memchr(states, s, nstates) && nstates < 7)
            states[nstates++] = s;
        int st;
        quiet += waitpid(pid, &st, WNOHANG | WUNTRACED | WCONTINUED) == 0;
        double t0 = now_us();
        int done = 0, r = 0, sig = 0;
        if (kind >= 2) {
            kill(pid, kind == 2 ? SIGTERM : SIGKILL);
            r = wait_child(pid, 100, &sig); // still held: the listener lives
            if (r == -2)
                alive_before++;
            else
                done = 1;
        }
        if (!done)
            t0 = now_us();
        kill(l.pid, SIGKILL); // the target first, then the listener reaped
        if (!done)
            r = wait_child(pid, 2000, &sig);
        after[i] = now_us() - t0;
        stop_listener(&l);
        if (r == -2) {
            stuck++;
            kill(pid, SIGKILL);
            wait_child(pid, 0, NULL);
        } else if (kind < 2 ? r == 7
                            : r == -1 && sig == (kind == 2 ? SIGTERM : SIGKILL))
            ran++;
        else
            other++;
    }
    qsort(after, tries, sizeof *after, cmpd);
    printf("death %-24s %d tries: parent's WNOHANG empty while held %d, "
           "state while held '%s', %s %d, stuck %d, other %d, "
           "alive 100 ms after the signal %d, stops seen %d, "
           "p50 listener kill (or signal) to exit %.0f us\n",
           names[kind], tries, quiet, states,
           kind == 2 ? "died of SIGTERM"
                     : kind == 3 ? "died of SIGKILL" : "exited 7",
           ran, stuck, other, alive_before, visible, after[tries / 2]);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    int tries = argc > 2 ? atoi(argv[2]) : 20;
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
        die("private mount namespace");
    snprintf(dir, sizeof dir, "/tmp/exec-hold.%d", getpid());
    if (mkdir(dir, 0755) || mount("tmpfs", dir, "tmpfs", 0, "size=1m"))
        die(dir);
    snprintf(target, sizeof target, "%s/target", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    write_target(target);
    write_target(other);
    setvbuf(stdout, NULL, _IOLBF, 0);
    loadavg("before");
    part_check(tries);
    part_cost(n);
    for (int k = 0; k < 4; k++)
        part_death(k, tries);
    loadavg("after");
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    return 0;
}
