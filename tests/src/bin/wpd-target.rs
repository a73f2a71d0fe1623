//! `wpd-target`: the multi-threaded sample process that wpd's end-to-end tests and demo watch.
//!
//! `wpd-target --threads N [--interval-us U] [--spin] [--sched-idle] [--churn]` starts N
//! worker threads that keep storing an increasing number into `VARS[0]`, prints one
//! `READY ...` line with its pid and the addresses of the eight watched variables, then obeys
//! one command per stdin line, answering each with exactly one stdout line.
//!
//! `--sched-idle` (with `--spin`): each worker moves itself to `SCHED_IDLE` once it has
//! reported its tid, so that every CPU stays busy with the target's threads while
//! normal-priority processes (the daemon, a benchmark) still get CPU time. The workers start
//! storing only once all of them exist (just before `READY`): thread creation slows down
//! with every thread already spinning.
//!
//! Credentials, for the authorization tests (applied first, before any thread exists):
//! `--become UID:GID` (started as root: take these real, effective and saved ids, and no
//! supplementary groups; the kernel then makes the process non-dumpable), `--keep-caps` (keep
//! the permitted capabilities across `--become`), `--dumpable` (`prctl(PR_SET_DUMPABLE, 1)`
//! afterwards), `--undumpable` (`prctl(PR_SET_DUMPABLE, 0)`).

//!
//! `--churn`: the N workers are *creators* instead: after `churn-start`, each loops on
//! "spawn a thread whose only action is one store to `VARS[0]`, join it" until quit,
//! `stop-workers` or `churn-stop` (the thread churn of `perf bench breakpoint thread`). Until
//! `churn-start` they wait (sleeping), so that their tids can be listed and watched first.
//!
//!
//! | command          | effect                                                        | reply                     |
//! |------------------|---------------------------------------------------------------|---------------------------|
//! | `spawn`          | new thread: first action is one store of 0xC0FFEE to `VARS[1]`, then it parks until quit | `SPAWNED tid=T` |
//! | `spawn-worker`   | one more worker like the initial ones                         | `SPAWNED tid=T`           |
//! | `write I V`      | the main thread stores V (decimal or 0x-hex) into `VARS[I]`  | `WROTE`                   |
//! | `thread-write I V` | a new thread stores V into `VARS[I]`, counts the SIGUSR1 its own handler ran, and exits; joined | `THREAD-WROTE tid=T usr1=N` |
//! | `thread-write-blocked I V` | a new thread blocks SIGUSR1, stores V into `VARS[I]`, and reports whether SIGUSR1 is pending for it alone (`SigPnd` of `/proc/thread-self/status`, not the process's `ShdPnd`) before it exits; joined | `THREAD-WROTE-BLOCKED tid=T pending=0\|1` |
//! | `stop-workers`   | every worker (initial and spawned) exits and is joined        | `STOPPED remaining=K`     |
//! | `ping`           | nothing                                                       | `PONG counter=C threads=K`|
//! | `usr1count`      | nothing                                                       | `USR1 N`                  |
//! | `catch-sig N`    | installs a handler (counting, like SIGUSR1's) for signal N    | `CAUGHT N`                |
//! | `block-sig N`    | the commanding thread blocks signal N                          | `BLOCKED N`               |
//! | `ignore-sig N`   | the process ignores signal N (`SIG_IGN`)                       | `IGNORED N`               |
//! | `int3`           | the commanding thread executes `int3`: the kernel sends SIGTRAP (SI_KERNEL), which kills the process | none (it dies) |
//! | `abort`          | `abort()`: SIGABRT, which kills the process                    | none (it dies)            |
//! | `bench-writes I N` | the main thread stores to `VARS[I]` N times, timed          | `BENCH ns=T`              |
//! | `hammer I T MS`  | T new threads store to `VARS[I]` in a tight loop for MS ms, then exit; joined | `HAMMER stores=S ns=T` |
//! | `churn-start`    | (`--churn`) the creators start churning                       | `CHURNING creators=N`     |
//! | `churn-stats`    | (`--churn`) threads created and joined since the previous `churn-stats` (or `churn-start`), and the ns elapsed; starts a new window | `CHURN n=C ns=T` |
//! | `churn-stop`     | (`--churn`) the creators stop; answered once none has a thread alive: C threads were created and joined since the previous `churn-stats` (or `churn-start`), every one of them gone | `CHURN-STOPPED n=C ns=T` |
//! | `exec N`         | exec itself with N workers (same pid)                         | a new `READY ...` line    |
//! | `exec-path P N`  | exec the program at P (a copy of this one, e.g. setuid) with N workers | a new `READY ...` line |
//! | `fork [MS]`      | fork a child process (only the main thread is copied) that stores 1..=50 into `VARS[0]` 2 ms apart, lives MS ms more (0 if not given), prints nothing and exits 0 | `FORKED pid=C` |
//! | `fork-undumpable [MS]` | as `fork`, the child first making itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): only root may trace it | `FORKED pid=C` |
//! | `wait-child C`   | waitpid for that child                                        | `CHILD pid=C code=N` or `CHILD pid=C signal=S` |
//! | `leader-exit`    | the main thread ends alone (the `exit` syscall, as `pthread_exit` does): the process lives on with a zombie leader; a new thread takes over the commands | `LEADER-EXITED commander=T` once `/proc` shows the leader a zombie |
//! | `quit` / EOF     | exit 0                                                        | `BYE` (quit only)         |
//!
//! `USR1 N` is the number of SIGUSR1 its handler has run (on whichever thread the kernel
//! picked): a tracer that swallowed or duplicated signals would show. Invalid commands get
//! `ERR <reason>`. The program deliberately installs no SIGTRAP handler: a stray debug trap
//! (a broken daemon) must kill it so that the tests notice.

use std::cell::UnsafeCell;
use std::hint;
use std::io::{self, BufRead, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// One watched variable, alone on its 64-byte cache line.
#[repr(C, align(64))]
struct AlignedU64(UnsafeCell<u64>);

// SAFETY: the cell is only accessed through volatile, naturally aligned 8-byte loads and
// stores (`store`/`load` below). On x86-64 those are single `mov` instructions and therefore
// single-copy atomic; a racing reader sees either the old or the new value. Volatile (rather
// than an atomic) is used on purpose: every loop iteration must be exactly one plain store
// instruction that the compiler may neither merge nor drop, because that is what the
// hardware watchpoints observe.
unsafe impl Sync for AlignedU64 {}

impl AlignedU64 {
    const fn new() -> Self {
        AlignedU64(UnsafeCell::new(0))
    }

    fn addr(&self) -> usize {
        self.0.get() as usize
    }

    #[inline(never)]
    fn store(&self, value: u64) {
        // SAFETY: valid, aligned pointer into a static; see the `Sync` impl.
        unsafe { std::ptr::write_volatile(self.0.get(), value) }
    }

    fn load(&self) -> u64 {
        // SAFETY: valid, aligned pointer into a static; see the `Sync` impl.
        unsafe { std::ptr::read_volatile(self.0.get()) }
    }
}

/// The watched variables. Workers store to `VARS[0]` only; `spawn` threads store to `VARS[1]`
/// once; the rest are touched only by `write`.
static VARS: [AlignedU64; 8] = [const { AlignedU64::new() }; 8];

/// Source of the increasing numbers the workers store (kept off the watched lines).
#[repr(C, align(64))]
struct Counter(AtomicU64);
static COUNTER: Counter = Counter(AtomicU64::new(0));

/// Set while `stop-workers` asks every worker to leave its loop.
static STOP: AtomicBool = AtomicBool::new(false);

/// `--sched-idle`: opened (true) once every worker exists.
static GATE: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

fn open_gate() {
    *GATE.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
    GATE.1.notify_all();
}

fn wait_gate() {
    let mut open = GATE.0.lock().unwrap_or_else(|e| e.into_inner());
    while !*open {
        open = GATE.1.wait(open).unwrap_or_else(|e| e.into_inner());
    }
}

/// Set by `churn-start`: the creators (`--churn`) begin.
static CHURN_GO: AtomicBool = AtomicBool::new(false);

/// Creators between their look at [`CHURN_GO`] and the join of the thread it let them create
/// (`churn-stop` waits for none).
static CHURN_BUSY: AtomicUsize = AtomicUsize::new(0);

/// Threads created and joined by the creators so far (`--churn`).
#[repr(C, align(64))]
struct Churned(AtomicU64);
static CHURNED: Churned = Churned(AtomicU64::new(0));

/// SIGUSR1 deliveries counted by [`on_usr1`].
static USR1_COUNT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// SIGUSR1 deliveries [`on_usr1`] ran on this thread (`thread-write`
    /// reports its writer's: a signal sent to the process instead of the
    /// writing thread would run on another).
    static THREAD_USR1: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

extern "C" fn on_usr1(_sig: libc::c_int) {
    // Async-signal-safe: one atomic add, and a constant-initialized
    // thread-local cell (no lazy registration, no destructor).
    USR1_COUNT.fetch_add(1, Ordering::SeqCst);
    THREAD_USR1.with(|c| c.set(c.get() + 1));
}

/// Installs [`on_usr1`] for SIGUSR1 (`SA_RESTART`: stdin reads and sleeps carry on).
fn install_usr1_handler() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; the handler only touches an
    // atomic, which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Value the `spawn` threads store into `VARS[1]`.
const SPAWN_MARK: u64 = 0xC0FFEE;

/// Stack size of every thread we create (kept small so that thousands of threads are cheap).
const STACK_SIZE: usize = 128 * 1024;

#[derive(Clone, Copy)]
struct Config {
    threads: usize,
    interval: Duration,
    spin: bool,
    sched_idle: bool,
    churn: bool,
    /// `--become UID:GID`.
    become_ids: Option<(u32, u32)>,
    keep_caps: bool,
    /// `--dumpable` (Some(true)) or `--undumpable` (Some(false)).
    dumpable: Option<bool>,
}

const USAGE: &str = "usage: wpd-target --threads N [--interval-us U] [--spin] [--sched-idle] \
                     [--churn] [--become UID:GID [--keep-caps]] [--dumpable | --undumpable]";

/// Applies `--become`, `--keep-caps`, `--dumpable`/`--undumpable` (single-threaded still).
fn apply_credentials(cfg: &Config) -> io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    if let Some((uid, gid)) = cfg.become_ids {
        // SAFETY: plain credential syscalls on this (only) thread.
        unsafe {
            if cfg.keep_caps {
                check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0))?;
            }
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(gid, gid, gid))?;
            check(libc::setresuid(uid, uid, uid))?;
        }
    }
    if let Some(d) = cfg.dumpable {
        // SAFETY: prctl on the calling process.
        check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_ulong::from(d), 0, 0, 0) })?;
    }
    Ok(())
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        threads: 4,
        interval: Duration::from_micros(1000),
        spin: false,
        sched_idle: false,
        churn: false,
        become_ids: None,
        keep_caps: false,
        dumpable: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse::<u64>()
                .map_err(|e| format!("{name}: {e}"))
        };
        match arg.as_str() {
            "--threads" => cfg.threads = value("--threads")? as usize,
            "--interval-us" => cfg.interval = Duration::from_micros(value("--interval-us")?),
            "--spin" => cfg.spin = true,
            "--sched-idle" => cfg.sched_idle = true,
            "--churn" => cfg.churn = true,
            "--become" => {
                let v = args.next().ok_or("--become needs UID:GID")?;
                let (u, g) = v
                    .split_once(':')
                    .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
                    .ok_or_else(|| format!("--become {v:?}: expected UID:GID"))?;
                cfg.become_ids = Some((u, g));
            }
            "--keep-caps" => cfg.keep_caps = true,
            "--dumpable" => cfg.dumpable = Some(true),
            "--undumpable" => cfg.dumpable = Some(false),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(cfg)
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn task_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The body of a worker: report the tid, then store increasing numbers into `VARS[0]`
/// (or, with `--churn`, create and join threads).
fn worker(cfg: Config, tid_tx: mpsc::Sender<i32>) {
    let _ = tid_tx.send(gettid());
    drop(tid_tx);
    if cfg.churn {
        churner();
        return;
    }
    if cfg.sched_idle {
        // After the tid is sent: the main thread is not kept waiting behind
        // the other idle-priority spinners.
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: valid sched_param; pid 0 is the calling thread.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        wait_gate();
    }
    while !STOP.load(Ordering::Relaxed) {
        let n = COUNTER.0.fetch_add(1, Ordering::Relaxed) + 1;
        VARS[0].store(n);
        if cfg.spin {
            for _ in 0..1000 {
                hint::spin_loop();
            }
        } else {
            thread::sleep(cfg.interval);
        }
    }
}

/// The body of a `--churn` creator: wait for `churn-start`, then create and join threads
/// until `STOP`.
fn churner() {
    while !STOP.load(Ordering::Relaxed) {
        // Busy first, then the look (both SeqCst, as `churn-stop`'s store and wait): either
        // `churn-stop` sees this creator busy, or the creator sees the churn stopped.
        CHURN_BUSY.fetch_add(1, Ordering::SeqCst);
        if !CHURN_GO.load(Ordering::SeqCst) {
            CHURN_BUSY.fetch_sub(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(1));
            continue;
        }
        let spawned = thread::Builder::new()
            .stack_size(STACK_SIZE)
            .spawn(|| VARS[0].store(1));
        match spawned {
            Ok(handle) => {
                let _ = handle.join();
                CHURNED.0.fetch_add(1, Ordering::Relaxed);
                CHURN_BUSY.fetch_sub(1, Ordering::SeqCst);
            }
            Err(e) => {
                CHURN_BUSY.fetch_sub(1, Ordering::SeqCst);
                eprintln!("wpd-target: churn: cannot create a thread: {e}");
                thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// `hammer`: `threads` new threads store to `VARS[index]` as fast as they can for
/// `duration`; returns (stores made, ns elapsed).
fn hammer(index: usize, threads: usize, duration: Duration) -> io::Result<(u64, u128)> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::with_capacity(threads);
    for _ in 0..threads {
        handles.push(
            thread::Builder::new()
                .name("hammer".into())
                .stack_size(STACK_SIZE)
                .spawn(move || {
                    let mut k = 0u64;
                    while Instant::now() < deadline {
                        VARS[index].store(k);
                        k += 1;
                    }
                    k
                })?,
        );
    }
    let stores = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    Ok((stores, start.elapsed().as_nanos()))
}

/// Starts one worker and returns its handle and tid (once the thread is running).
fn start_worker(cfg: Config, index: usize) -> io::Result<(JoinHandle<()>, i32)> {
    let (tx, rx) = mpsc::channel();
    let handle = thread::Builder::new()
        .name(format!("worker-{index}"))
        .stack_size(STACK_SIZE)
        .spawn(move || worker(cfg, tx))?;
    let tid = rx
        .recv()
        .map_err(|_| io::Error::other("worker died before reporting its tid"))?;
    Ok((handle, tid))
}

/// Starts a thread whose very first action is one store to `VARS[1]`; it then reports its tid
/// and parks until the process exits.
fn start_marker_thread() -> io::Result<i32> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("spawned".into())
        .stack_size(STACK_SIZE)
        .spawn(move || {
            VARS[1].store(SPAWN_MARK);
            let _ = tx.send(gettid());
            drop(tx);
            loop {
                thread::park();
            }
        })?;
    rx.recv()
        .map_err(|_| io::Error::other("spawned thread died before reporting its tid"))
}

/// Stores the child of `fork` makes into `VARS[0]` (it lives ~100 ms, so that the tests can
/// look for it while it runs).
const FORK_STORES: u64 = 50;
/// Pause after each of those stores.
const FORK_STORE_PAUSE_NS: libc::c_long = 2_000_000;

/// Forks a child process whose only thread (a copy of the calling one) stores
/// `1..=FORK_STORES` into `VARS[0]`, pausing between stores, lives `linger_ms` more, then exits
/// 0. The child runs only async-signal-safe code (volatile stores, `nanosleep`, `_exit`): the
/// parent has other threads, whose locks may be held at the fork.
fn fork_storer(undumpable: bool, linger_ms: u32) -> io::Result<libc::pid_t> {
    // SAFETY: fork has no preconditions; the child below calls only async-signal-safe code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        if undumpable {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        }
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: FORK_STORE_PAUSE_NS,
        };
        for n in 1..=FORK_STORES {
            VARS[0].store(n);
            // SAFETY: valid timespec; a null remainder is allowed.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
        let linger = libc::timespec {
            tv_sec: (linger_ms / 1000) as libc::time_t,
            tv_nsec: (linger_ms % 1000) as libc::c_long * 1_000_000,
        };
        // SAFETY: valid timespec; a null remainder is allowed.
        unsafe { libc::nanosleep(&linger, std::ptr::null_mut()) };
        // SAFETY: _exit ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(0) }
    }
    Ok(pid)
}

/// `waitpid` for a child of `fork`; the reply names its exit code or signal.
fn wait_child(pid: libc::pid_t) -> String {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r < 0 {
        return format!("ERR waitpid {pid}: {}", io::Error::last_os_error());
    }
    if libc::WIFEXITED(status) {
        format!("CHILD pid={pid} code={}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("CHILD pid={pid} signal={}", libc::WTERMSIG(status))
    } else {
        format!("CHILD pid={pid} status={status:#x}")
    }
}

struct State {
    cfg: Config,
    workers: Vec<JoinHandle<()>>,
    next_index: usize,
    /// Threads created by `spawn` (they never exit).
    markers: usize,
    /// `--churn`: `CHURNED` and the time at the start of the current `churn-stats` window.
    churn_mark: Option<(u64, Instant)>,
}

impl State {
    fn handle(&mut self, line: &str) -> Option<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            [] => return None,
            ["spawn"] => match start_marker_thread() {
                Ok(tid) => {
                    self.markers += 1;
                    format!("SPAWNED tid={tid}")
                }
                Err(e) => format!("ERR spawn: {e}"),
            },
            ["spawn-worker"] => match start_worker(self.cfg, self.next_index) {
                Ok((handle, tid)) => {
                    self.next_index += 1;
                    self.workers.push(handle);
                    format!("SPAWNED tid={tid}")
                }
                Err(e) => format!("ERR spawn-worker: {e}"),
            },
            ["write", index, value] => match (index.parse::<usize>(), parse_u64(value)) {
                (Ok(i), Some(v)) if i < VARS.len() => {
                    VARS[i].store(v);
                    "WROTE".to_string()
                }
                _ => format!("ERR usage: write <0..{}> <value>", VARS.len() - 1),
            },
            ["thread-write", index, value] => match (index.parse::<usize>(), parse_u64(value)) {
                (Ok(i), Some(v)) if i < VARS.len() => {
                    let writer = thread::Builder::new()
                        .name("writer".into())
                        .stack_size(STACK_SIZE)
                        .spawn(move || {
                            VARS[i].store(v);
                            (gettid(), THREAD_USR1.with(|c| c.get()))
                        });
                    match writer.map(|h| h.join()) {
                        Ok(Ok((tid, n))) => format!("THREAD-WROTE tid={tid} usr1={n}"),
                        Ok(Err(_)) => "ERR thread-write: the writer panicked".to_string(),
                        Err(e) => format!("ERR thread-write: {e}"),
                    }
                }
                _ => format!("ERR usage: thread-write <0..{}> <value>", VARS.len() - 1),
            },
            ["thread-write-blocked", index, value] => {
                match (index.parse::<usize>(), parse_u64(value)) {
                    (Ok(i), Some(v)) if i < VARS.len() => {
                        let writer = thread::Builder::new()
                            .name("writer".into())
                            .stack_size(STACK_SIZE)
                            .spawn(move || {
                                // SAFETY: a sigset built by sigemptyset/sigaddset, applied to
                                // this thread only.
                                unsafe {
                                    let mut set: libc::sigset_t = std::mem::zeroed();
                                    libc::sigemptyset(&mut set);
                                    libc::sigaddset(&mut set, libc::SIGUSR1);
                                    libc::pthread_sigmask(
                                        libc::SIG_BLOCK,
                                        &set,
                                        std::ptr::null_mut(),
                                    );
                                }
                                VARS[i].store(v);
                                let own = std::fs::read_to_string("/proc/thread-self/status")
                                    .ok()
                                    .and_then(|st| {
                                        st.lines().find_map(|l| {
                                            let m = l.strip_prefix("SigPnd:")?.trim();
                                            u64::from_str_radix(m, 16).ok()
                                        })
                                    })
                                    .unwrap_or(0);
                                (gettid(), own >> (libc::SIGUSR1 - 1) & 1)
                            });
                        match writer.map(|h| h.join()) {
                            Ok(Ok((tid, p))) => {
                                format!("THREAD-WROTE-BLOCKED tid={tid} pending={p}")
                            }
                            Ok(Err(_)) => "ERR thread-write-blocked: the writer panicked".into(),
                            Err(e) => format!("ERR thread-write-blocked: {e}"),
                        }
                    }
                    _ => format!(
                        "ERR usage: thread-write-blocked <0..{}> <value>",
                        VARS.len() - 1
                    ),
                }
            }
            ["stop-workers"] => {
                STOP.store(true, Ordering::Relaxed);
                for handle in self.workers.drain(..) {
                    let _ = handle.join();
                }
                STOP.store(false, Ordering::Relaxed);
                // A joined thread can linger in /proc for a moment after its joiner woke up.
                let expected = 1 + self.markers;
                let deadline = Instant::now() + Duration::from_secs(2);
                while task_count() > expected && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                format!("STOPPED remaining={}", task_count())
            }
            ["fork", rest @ ..] | ["fork-undumpable", rest @ ..] if rest.len() <= 1 => {
                let undumpable = words[0] == "fork-undumpable";
                match rest.first().map_or(Ok(0), |ms| ms.parse::<u32>()) {
                    Ok(linger_ms) => match fork_storer(undumpable, linger_ms) {
                        Ok(child) => format!("FORKED pid={child}"),
                        Err(e) => format!("ERR fork: {e}"),
                    },
                    Err(_) => format!("ERR usage: {} [linger ms]", words[0]),
                }
            }
            ["wait-child", pid] => match pid.parse::<libc::pid_t>() {
                Ok(pid) => wait_child(pid),
                Err(_) => "ERR usage: wait-child <pid>".to_string(),
            },
            ["ping"] => format!("PONG counter={} threads={}", VARS[0].load(), task_count()),
            ["usr1count"] => format!("USR1 {}", USR1_COUNT.load(Ordering::SeqCst)),
            ["int3"] => {
                // SAFETY: a breakpoint instruction; with no SIGTRAP handler
                // (this program installs none) the process dies here.
                unsafe { std::arch::asm!("int3") };
                "ERR survived int3".to_string()
            }
            ["abort"] => std::process::abort(),
            ["catch-sig", n] => match n.parse::<libc::c_int>() {
                // SAFETY: as in `install_usr1_handler`: the handler only
                // touches an atomic.
                Ok(n) => unsafe {
                    let mut sa: libc::sigaction = std::mem::zeroed();
                    sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
                    sa.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut sa.sa_mask);
                    if libc::sigaction(n, &sa, std::ptr::null_mut()) == 0 {
                        format!("CAUGHT {n}")
                    } else {
                        format!("ERR sigaction: {}", io::Error::last_os_error())
                    }
                },
                Err(_) => "ERR usage: catch-sig <signal number>".to_string(),
            },
            ["block-sig", n] => match n.parse::<libc::c_int>() {
                // SAFETY: changes only this thread's signal mask.
                Ok(n) => unsafe {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, n);
                    if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == 0 {
                        format!("BLOCKED {n}")
                    } else {
                        "ERR pthread_sigmask".to_string()
                    }
                },
                Err(_) => "ERR usage: block-sig <signal number>".to_string(),
            },
            ["ignore-sig", n] => match n.parse::<libc::c_int>() {
                // SAFETY: SIG_IGN for one signal; no handler runs.
                Ok(n) => unsafe {
                    if libc::signal(n, libc::SIG_IGN) == libc::SIG_ERR {
                        format!("ERR signal: {}", io::Error::last_os_error())
                    } else {
                        format!("IGNORED {n}")
                    }
                },
                Err(_) => "ERR usage: ignore-sig <signal number>".to_string(),
            },
            ["exec", n] => match n.parse::<usize>() {
                Ok(n) => {
                    use std::os::unix::process::CommandExt;
                    let err = std::process::Command::new("/proc/self/exe")
                        .args(["--threads", &n.to_string()])
                        .exec();
                    format!("ERR exec: {err}")
                }
                Err(_) => "ERR usage: exec <workers>".to_string(),
            },
            ["exec-path", path, n] => match n.parse::<usize>() {
                Ok(n) => {
                    use std::os::unix::process::CommandExt;
                    let err = std::process::Command::new(path)
                        .args(["--threads", &n.to_string()])
                        .exec();
                    format!("ERR exec-path: {err}")
                }
                Err(_) => "ERR usage: exec-path <program> <workers>".to_string(),
            },
            ["bench-writes", index, n] => match (index.parse::<usize>(), n.parse::<u64>()) {
                (Ok(i), Ok(n)) if i < VARS.len() => {
                    let start = Instant::now();
                    for k in 0..n {
                        VARS[i].store(k);
                    }
                    format!("BENCH ns={}", start.elapsed().as_nanos())
                }
                _ => format!("ERR usage: bench-writes <0..{}> <count>", VARS.len() - 1),
            },
            ["hammer", index, threads, ms] => match (
                index.parse::<usize>(),
                threads.parse::<usize>(),
                ms.parse::<u64>(),
            ) {
                (Ok(i), Ok(t), Ok(ms)) if i < VARS.len() && t > 0 => {
                    match hammer(i, t, Duration::from_millis(ms)) {
                        Ok((stores, ns)) => format!("HAMMER stores={stores} ns={ns}"),
                        Err(e) => format!("ERR hammer: {e}"),
                    }
                }
                _ => format!("ERR usage: hammer <0..{}> <threads> <ms>", VARS.len() - 1),
            },
            ["churn-start"] if self.cfg.churn => {
                self.churn_mark = Some((CHURNED.0.load(Ordering::Relaxed), Instant::now()));
                CHURN_GO.store(true, Ordering::SeqCst);
                format!("CHURNING creators={}", self.workers.len())
            }
            ["churn-stop"] if self.cfg.churn => match self.churn_mark {
                Some((n0, t0)) => {
                    CHURN_GO.store(false, Ordering::SeqCst);
                    while CHURN_BUSY.load(Ordering::SeqCst) != 0 {
                        thread::sleep(Duration::from_micros(100));
                    }
                    let (n, now) = (CHURNED.0.load(Ordering::Relaxed), Instant::now());
                    self.churn_mark = Some((n, now));
                    format!("CHURN-STOPPED n={} ns={}", n - n0, (now - t0).as_nanos())
                }
                None => "ERR churn-stop: no churn-start".to_string(),
            },
            ["churn-stats"] => match self.churn_mark {
                Some((n0, t0)) => {
                    let (n, now) = (CHURNED.0.load(Ordering::Relaxed), Instant::now());
                    self.churn_mark = Some((n, now));
                    format!("CHURN n={} ns={}", n - n0, (now - t0).as_nanos())
                }
                None => "ERR churn-stats: no churn-start (needs --churn)".to_string(),
            },
            ["churn-start" | "churn-stop"] => format!("ERR {line} needs --churn"),
            _ => format!("ERR unknown command {line:?}"),
        };
        Some(reply)
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn main() -> ExitCode {
    let cfg = match parse_args() {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("wpd-target: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    if let Err(e) = apply_credentials(&cfg) {
        eprintln!("wpd-target: cannot set the credentials asked for: {e}");
        return ExitCode::from(1);
    }

    // Before any thread exists, so that every thread can run the handler.
    if let Err(e) = install_usr1_handler() {
        eprintln!("wpd-target: cannot install the SIGUSR1 handler: {e}");
        return ExitCode::from(1);
    }

    let mut state = State {
        cfg,
        workers: Vec::with_capacity(cfg.threads),
        next_index: 0,
        markers: 0,
        churn_mark: None,
    };
    for _ in 0..cfg.threads {
        match start_worker(cfg, state.next_index) {
            Ok((handle, _tid)) => {
                state.next_index += 1;
                state.workers.push(handle);
            }
            Err(e) => {
                eprintln!("wpd-target: cannot start worker {}: {e}", state.next_index);
                return ExitCode::from(1);
            }
        }
    }

    open_gate();
    let addrs: Vec<String> = VARS.iter().map(|v| format!("{:#x}", v.addr())).collect();
    {
        let stdout = io::stdout();
        let mut out = stdout.lock();
        let ready = writeln!(
            out,
            "READY pid={} threads={} vars={}",
            std::process::id(),
            cfg.threads,
            addrs.join(",")
        )
        .and_then(|()| out.flush());
        if ready.is_err() {
            return ExitCode::from(1);
        }
    }

    if let Served::LeaderExit = serve(&mut state) {
        leader_exit(state);
    }
    // Exit without joining: workers and parked threads die with the process.
    std::process::exit(0)
}

/// Why [`serve`] stopped reading commands.
enum Served {
    /// `quit`, end of input, or stdout closed.
    Done,
    /// `leader-exit`: the calling (main) thread is to end alone.
    LeaderExit,
}

/// Reads commands from stdin and answers each on stdout until `quit`, EOF or `leader-exit`.
fn serve(state: &mut State) -> Served {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "quit" => {
                let _ = writeln!(out, "BYE").and_then(|()| out.flush());
                break;
            }
            "leader-exit" => return Served::LeaderExit,
            _ => {}
        }
        if let Some(reply) = state.handle(line.trim())
            && writeln!(out, "{reply}").and_then(|()| out.flush()).is_err()
        {
            break;
        }
    }
    Served::Done
}

/// `leader-exit`: hands the commands to a new thread, then ends the main thread alone with the
/// raw `exit` syscall (what `pthread_exit` ends with; no unwinding, no atexit handlers). The
/// kernel keeps the leader as a zombie while the other threads live. The new thread answers
/// once `/proc` shows the leader as a zombie, then serves commands; `quit` from it ends the
/// whole process.
fn leader_exit(mut state: State) -> ! {
    let leader = std::process::id();
    let spawned = thread::Builder::new()
        .name("commander".into())
        .stack_size(STACK_SIZE)
        .spawn(move || {
            let path = format!("/proc/{leader}/task/{leader}/stat");
            let deadline = Instant::now() + Duration::from_secs(5);
            let zombie = loop {
                let state_letter = std::fs::read_to_string(&path).ok().and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().next()?.chars().next())
                });
                if matches!(state_letter, Some('Z') | Some('X') | None) {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                thread::sleep(Duration::from_millis(1));
            };
            let reply = if zombie {
                format!("LEADER-EXITED commander={}", gettid())
            } else {
                "ERR leader-exit: the main thread did not exit within 5 s".to_string()
            };
            {
                let stdout = io::stdout();
                let mut out = stdout.lock();
                if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
                    std::process::exit(1);
                }
            }
            serve(&mut state);
            std::process::exit(0)
        });
    if let Err(e) = spawned {
        eprintln!("wpd-target: leader-exit: cannot start the commander thread: {e}");
        std::process::exit(1);
    }
    // SAFETY: SYS_exit ends only the calling thread. Nothing of this thread is used after it:
    // the state moved to the commander, and the stdio locks were released by `serve`.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("the exit syscall returned")
}
