/* objfloor: the floor of arming a watchpoint on every object a function
 * returns, by the kernel's means alone, for wpd-bench's objects section.
 *
 *   objfloor TARGET N US
 *
 * runs `TARGET pace N US` (tests/c/objects.c: N objects, one every US µs,
 * each made by conn_new and freed by conn_free) under a bare tracer doing
 * the kernel's part of what `wpctl watch --on-return conn_new --expr
 * '$ret->state' --disarm-on free` does on a one-thread target, and nothing
 * else:
 *
 *   - a uretprobe on conn_new whose BPF program sends the thread a signal
 *     (bpf_send_signal_thread): one signal stop per object;
 *   - at that stop, the returned object's `state` (offset 8 of struct
 *     conn) gets a write breakpoint on the thread, with a no-op BPF program
 *     attached (a breakpoint of wpd's runs its program at each trap), and
 *     the previous object's breakpoint is closed: the next stop is where a
 *     freed object's breakpoint can go without stopping the thread at free;
 *   - a uprobe at libc's free with a no-op BPF program (wpd's marks the
 *     object freed there, without a stop).
 *
 * No symbols are looked up per object, no ledger, no events: what is left
 * is the stop, the open and close, the probes and the traps of a freed
 * object's breakpoint on glibc's own stores into the chunk. The target's
 * PACE line is printed as it is.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#define STATE_OFFSET 8 /* offsetof(struct conn, state) in objects.c */
#define STOP_SIGNAL SIGUSR2
#define HELPER_SEND_SIGNAL_THREAD 117 /* BPF_FUNC_send_signal_thread */

static void die(const char *what)
{
    fprintf(stderr, "objfloor: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* The file offset of symbol `name` in the ELF file `path` (its symbol
 * table, else its dynamic one), through the loadable segment holding it. */
static uint64_t file_offset(const char *path, const char *name)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        die(path);
    struct stat st;
    if (fstat(fd, &st) != 0)
        die(path);
    const uint8_t *f = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f == MAP_FAILED)
        die(path);
    close(fd);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
    uint64_t value = 0;
    for (int pass = 0; pass < 2 && !value; pass++) {
        uint32_t want = pass == 0 ? SHT_SYMTAB : SHT_DYNSYM;
        for (int i = 0; i < eh->e_shnum && !value; i++) {
            if (sh[i].sh_type != want)
                continue;
            const Elf64_Sym *sym = (const Elf64_Sym *)(f + sh[i].sh_offset);
            const char *str = (const char *)(f + sh[sh[i].sh_link].sh_offset);
            size_t n = sh[i].sh_size / sizeof *sym;
            for (size_t k = 0; k < n; k++) {
                if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && sym[k].st_value &&
                    strcmp(str + sym[k].st_name, name) == 0) {
                    value = sym[k].st_value;
                    break;
                }
            }
        }
    }
    if (!value) {
        fprintf(stderr, "objfloor: no function %s in %s\n", name, path);
        exit(1);
    }
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(f + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && value >= ph[i].p_vaddr &&
            value < ph[i].p_vaddr + ph[i].p_filesz)
            return value - ph[i].p_vaddr + ph[i].p_offset;
    }
    fprintf(stderr, "objfloor: %s of %s is in no loadable segment\n", name, path);
    exit(1);
}

static int load_prog(uint32_t type, const struct bpf_insn *insns, uint32_t n)
{
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = type;
    a.insn_cnt = n;
    a.insns = (uintptr_t)insns;
    a.license = (uintptr_t)"GPL";
    int fd = (int)syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
    if (fd < 0)
        die("BPF_PROG_LOAD");
    return fd;
}

/* r0 = 0; exit */
static int noop_prog(uint32_t type)
{
    struct bpf_insn insns[2];
    memset(insns, 0, sizeof insns);
    insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;
    insns[1].code = BPF_JMP | BPF_EXIT;
    return load_prog(type, insns, 2);
}

/* r1 = STOP_SIGNAL; call bpf_send_signal_thread; r0 = 0; exit */
static int signal_prog(void)
{
    struct bpf_insn insns[4];
    memset(insns, 0, sizeof insns);
    insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;
    insns[0].dst_reg = BPF_REG_1;
    insns[0].imm = STOP_SIGNAL;
    insns[1].code = BPF_JMP | BPF_CALL;
    insns[1].imm = HELPER_SEND_SIGNAL_THREAD;
    insns[2].code = BPF_ALU64 | BPF_MOV | BPF_K;
    insns[3].code = BPF_JMP | BPF_EXIT;
    return load_prog(BPF_PROG_TYPE_KPROBE, insns, 4);
}

static int uprobe_type(int *retprobe_bit)
{
    char buf[64];
    FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    if (!f || !fgets(buf, sizeof buf, f))
        die("/sys/bus/event_source/devices/uprobe/type");
    fclose(f);
    int type = atoi(buf);
    f = fopen("/sys/bus/event_source/devices/uprobe/format/retprobe", "r");
    if (!f || !fgets(buf, sizeof buf, f) || sscanf(buf, "config:%d", retprobe_bit) != 1)
        die("/sys/bus/event_source/devices/uprobe/format/retprobe");
    fclose(f);
    return type;
}

/* A uprobe (or uretprobe) on `path`+`offset` for process `pid`, running
 * `prog`. */
static int open_probe(pid_t pid, const char *path, uint64_t offset, int ret, int prog)
{
    int retprobe_bit;
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = uprobe_type(&retprobe_bit);
    a.size = sizeof a;
    a.config = ret ? 1ULL << retprobe_bit : 0;
    a.config1 = (uintptr_t)path;
    a.config2 = offset;
    a.sample_period = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, pid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0)
        die("perf_event_open(uprobe)");
    if (ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog) != 0)
        die("PERF_EVENT_IOC_SET_BPF(uprobe)");
    return fd;
}

static int open_breakpoint(pid_t tid, uint64_t addr, int prog)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.sample_period = 1;
    a.bp_type = HW_BREAKPOINT_W;
    a.bp_addr = addr;
    a.bp_len = HW_BREAKPOINT_LEN_8;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0)
        die("perf_event_open(breakpoint)");
    if (ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog) != 0)
        die("PERF_EVENT_IOC_SET_BPF(breakpoint)");
    return fd;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: objfloor TARGET N US\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char target[4096];
    if (!realpath(argv[1], target))
        die(argv[1]);
    Dl_info libc;
    if (!dladdr((void *)free, &libc) || !libc.dli_fname)
        die("dladdr(free)");
    char libc_path[4096];
    if (!realpath(libc.dli_fname, libc_path))
        die(libc.dli_fname);
    uint64_t new_off = file_offset(target, "conn_new");
    uint64_t free_off = file_offset(libc_path, "free");

    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) != 0)
            die("PTRACE_TRACEME");
        execl(target, target, "pace", argv[2], argv[3], (char *)NULL);
        die("exec");
    }
    int status;
    /* The exec's SIGTRAP: the program is loaded and has not run. */
    if (waitpid(child, &status, 0) != child || !WIFSTOPPED(status))
        die("waitpid(exec)");
    ptrace(PTRACE_SETOPTIONS, child, 0, PTRACE_O_EXITKILL);
    int sig_prog = signal_prog();
    int bp_prog = noop_prog(BPF_PROG_TYPE_PERF_EVENT);
    int free_prog = noop_prog(BPF_PROG_TYPE_KPROBE);
    open_probe(child, target, new_off, 1, sig_prog);
    open_probe(child, libc_path, free_off, 0, free_prog);

    int armed = -1;
    long objects = 0;
    int deliver = 0;
    for (;;) {
        if (ptrace(PTRACE_CONT, child, 0, deliver) != 0)
            die("PTRACE_CONT");
        if (waitpid(child, &status, 0) != child)
            die("waitpid");
        if (WIFEXITED(status) || WIFSIGNALED(status))
            break;
        deliver = WSTOPSIG(status);
        if (deliver != STOP_SIGNAL)
            continue;
        deliver = 0;
        struct user_regs_struct regs;
        if (ptrace(PTRACE_GETREGS, child, 0, &regs) != 0)
            die("PTRACE_GETREGS");
        if (armed >= 0)
            close(armed);
        armed = open_breakpoint(child, regs.rax + STATE_OFFSET, bp_prog);
        objects++;
    }
    if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "objfloor: the target ended with status %d\n", status);
        return 1;
    }
    fprintf(stderr, "objfloor: %ld objects armed\n", objects);
    return 0;
}
