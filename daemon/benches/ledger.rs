//! Accounting microbenchmark of the slot ledger, shaped like `perf bench breakpoint thread`.
//!
//! W worker OS threads each own T/W tids of their own pid. One round of a
//! worker registers its tids, reserves and commits 4 slots on each (4
//! single-thread reservations with distinct watch ids), releases them and
//! unregisters the tids: 14 accounting calls per tid per round, and an
//! "op" below is one such call (`Throughput::Elements(14 × T)` per round).
//!
//! The same workload runs against three implementations of [`Accounting`]:
//! - `ledger`: `wpd::ledger::Ledger` (sharded `DashMap`, slot bitmaps),
//!   driven as the perf backend drives it (`Retained::Avoid`, no retain);
//! - `ideal`: no accounting; workers only touch their per-thread local data,
//!   which every variant also does (the floor);
//! - `global_linear`: one `Mutex<Vec<_>>` scanned linearly on every lookup,
//!   the pre-2022 kernel design.
//!
//! After the criterion groups, a separate interleaved timing pass prints a
//! Markdown table of ns/op and ratios for every (T, W) to stdout; its last
//! column is the ledger-to-linear ratio net of the harness's own cost (the
//! `ideal` variant), which with 64 workers on a few cores is mostly their
//! barrier wake-ups. Set
//! `WPD_LEDGER_SUMMARY=0` to skip it.
//!
//! A second table compares `ledger` and `ideal` the way the kernel's
//! "within 5 % of no accounting" did: with the real work of each
//! reservation included. There every commit also opens a disabled write
//! breakpoint on every CPU for the calling thread and closes them (the
//! perf backend's syscalls for one thread and one watchpoint).

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use wpd::ledger::Retained;
use wpd::ledger::{Ledger, Reservation};
use wpd::model::{Pid, Tid, WatchId};

/// Hardware slots reserved per thread per round.
const SLOTS: usize = 4;
/// Accounting calls per tid per round: register, 4 × (reserve, commit),
/// 4 × release, unregister.
const OPS_PER_TID: u64 = 2 + 3 * SLOTS as u64;
/// Total traced threads.
const THREADS: [usize; 3] = [100, 1_000, 10_000];
/// Concurrent worker OS threads.
const WORKERS: [usize; 4] = [1, 2, 8, 64];
/// Most rounds `global_linear` really runs per sample at T = 10,000 (one
/// round there costs on the order of a second); the measured time is scaled
/// to the number of rounds criterion asked for.
const LINEAR_ROUND_CAP: u64 = 1;

/// What the workload needs from an accounting scheme.
trait Accounting: Sync {
    /// Proof of a reservation, handed back to `commit`.
    type Token;
    const NAME: &'static str;
    fn register(&self, pid: Pid, tid: Tid);
    fn reserve(&self, tid: Tid, id: WatchId) -> Self::Token;
    fn commit(&self, token: &Self::Token);
    fn release(&self, tid: Tid, id: WatchId);
    fn unregister(&self, tid: Tid);
}

impl Accounting for Ledger {
    type Token = Reservation;
    const NAME: &'static str = "ledger";

    fn register(&self, pid: Pid, tid: Tid) {
        assert!(self.add_thread(pid, tid), "tid {tid} already tracked");
    }

    fn reserve(&self, tid: Tid, id: WatchId) -> Self::Token {
        match self.reserve_one(tid, id, false, Retained::Avoid) {
            Ok(Some(r)) => r,
            Ok(None) => panic!("tid {tid} is not tracked or already holds {id:?}"),
            Err(conflict) => panic!("ledger refused a free slot: {conflict:?}"),
        }
    }

    fn commit(&self, token: &Self::Token) {
        Ledger::commit(self, std::slice::from_ref(token), None);
    }

    fn release(&self, tid: Tid, id: WatchId) {
        Ledger::release(self, tid, id, false);
    }

    fn unregister(&self, tid: Tid) {
        assert!(self.remove_thread(tid).is_some(), "tid {tid} not tracked");
    }
}

/// No accounting at all.
struct Ideal;

impl Accounting for Ideal {
    type Token = ();
    const NAME: &'static str = "ideal";

    fn register(&self, pid: Pid, tid: Tid) {
        black_box((pid, tid));
    }

    fn reserve(&self, tid: Tid, id: WatchId) {
        black_box((tid, id.0));
    }

    fn commit(&self, token: &()) {
        black_box(token);
    }

    fn release(&self, tid: Tid, id: WatchId) {
        black_box((tid, id.0));
    }

    fn unregister(&self, tid: Tid) {
        black_box(tid);
    }
}

/// `A` plus the kernel's work for each committed reservation: one disabled
/// write breakpoint per CPU opened on the calling thread, then closed.
struct WithKernel<'a, A> {
    inner: &'a A,
    cpus: Vec<i32>,
}

/// What the breakpoints watch (never written).
static WATCHED: u64 = 0;

fn kernel_work(cpus: &[i32]) {
    use perf_event_open_sys as sys;
    let mut attr = sys::bindings::perf_event_attr {
        type_: sys::bindings::PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
        bp_type: sys::bindings::HW_BREAKPOINT_W,
        ..Default::default()
    };
    attr.__bindgen_anon_3.bp_addr = &WATCHED as *const u64 as u64;
    attr.__bindgen_anon_4.bp_len = sys::bindings::HW_BREAKPOINT_LEN_8 as u64;
    attr.set_disabled(1);
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    let mut fds = [-1; 64];
    for (i, &cpu) in cpus.iter().enumerate().take(fds.len()) {
        // SAFETY: a valid attr; pid 0 is the calling thread.
        fds[i] = unsafe {
            sys::perf_event_open(
                &mut attr,
                0,
                cpu,
                -1,
                sys::bindings::PERF_FLAG_FD_CLOEXEC as _,
            )
        };
        assert!(
            fds[i] >= 0,
            "perf_event_open(breakpoint, cpu {cpu}): {}",
            std::io::Error::last_os_error()
        );
    }
    for fd in fds.into_iter().filter(|&fd| fd >= 0) {
        // SAFETY: closing an fd opened above.
        unsafe { libc::close(fd) };
    }
}

impl<A: Accounting> Accounting for WithKernel<'_, A> {
    type Token = A::Token;
    const NAME: &'static str = A::NAME;

    fn register(&self, pid: Pid, tid: Tid) {
        self.inner.register(pid, tid);
    }

    fn reserve(&self, tid: Tid, id: WatchId) -> Self::Token {
        self.inner.reserve(tid, id)
    }

    fn commit(&self, token: &Self::Token) {
        self.inner.commit(token);
        kernel_work(&self.cpus);
    }

    fn release(&self, tid: Tid, id: WatchId) {
        self.inner.release(tid, id);
    }

    fn unregister(&self, tid: Tid) {
        self.inner.unregister(tid);
    }
}

/// Online CPUs (as the perf backend opens one event per CPU).
fn online_cpus() -> Vec<i32> {
    let n = thread::available_parallelism().map_or(1, |n| n.get());
    (0..n as i32).collect()
}

/// The second summary table: `ledger` against `ideal`, each with the
/// kernel's work per reservation ([`WithKernel`]).
fn summary_with_kernel() {
    const REPS: usize = 5;
    let target = Duration::from_millis(100);
    let ledger = Ledger::new();
    let cpus = online_cpus();
    let with_ledger = WithKernel {
        inner: &ledger,
        cpus: cpus.clone(),
    };
    let with_ideal = WithKernel {
        inner: &Ideal,
        cpus: cpus.clone(),
    };
    println!();
    println!(
        "## with the kernel's work per reservation ({} breakpoint opens + closes), median of {REPS} runs",
        cpus.len()
    );
    println!();
    println!("| T | W | ideal + kernel ns/op | ledger + kernel ns/op | ledger/ideal |");
    println!("|---:|---:|---:|---:|---:|");
    for threads in [100, 1_000] {
        for workers in [1, 2, 8] {
            let rl = calibrate(&with_ledger, threads, workers, target);
            let ri = calibrate(&with_ideal, threads, workers, target);
            let (mut l, mut i) = (Vec::new(), Vec::new());
            for _ in 0..REPS {
                l.push(ns_per_op(&with_ledger, threads, workers, rl));
                i.push(ns_per_op(&with_ideal, threads, workers, ri));
            }
            let (l, i) = (median(l), median(i));
            println!(
                "| {threads} | {workers} | {i:.1} | {l:.1} | {:.3}× |",
                l / i
            );
        }
    }
}

/// One global lock over an unsorted vector of (tid, bitmap, holders); the
/// bitmap's low nibble is committed slots, the high nibble pending ones.
#[derive(Default)]
struct GlobalLinear {
    rows: Mutex<Vec<(Tid, u8, [u64; SLOTS])>>,
}

impl GlobalLinear {
    /// Runs `f` on the row of `tid`, found by a linear scan under the lock.
    fn with_row<R>(&self, tid: Tid, f: impl FnOnce(&mut (Tid, u8, [u64; SLOTS])) -> R) -> R {
        let mut rows = self.rows.lock().unwrap();
        let row = rows
            .iter_mut()
            .find(|r| r.0 == tid)
            .unwrap_or_else(|| panic!("tid {tid} not tracked"));
        f(row)
    }
}

impl Accounting for GlobalLinear {
    type Token = (Tid, u8);
    const NAME: &'static str = "global_linear";

    fn register(&self, _pid: Pid, tid: Tid) {
        let mut rows = self.rows.lock().unwrap();
        assert!(rows.iter().all(|r| r.0 != tid), "tid {tid} already tracked");
        rows.push((tid, 0, [0; SLOTS]));
    }

    fn reserve(&self, tid: Tid, id: WatchId) -> (Tid, u8) {
        self.with_row(tid, |row| {
            let busy = (row.1 | (row.1 >> SLOTS)) & 0xF;
            let free = !busy & 0xF;
            assert!(free != 0, "no free slot on tid {tid}");
            let slot = free.trailing_zeros() as u8;
            row.1 |= 1 << (slot + SLOTS as u8);
            row.2[slot as usize] = id.0;
            (tid, slot)
        })
    }

    fn commit(&self, &(tid, slot): &(Tid, u8)) {
        self.with_row(tid, |row| {
            row.1 &= !(1 << (slot + SLOTS as u8));
            row.1 |= 1 << slot;
        });
    }

    fn release(&self, tid: Tid, id: WatchId) {
        self.with_row(tid, |row| {
            for s in 0..SLOTS {
                if row.1 & (1 << s) != 0 && row.2[s] == id.0 {
                    row.1 &= !(1 << s);
                    row.2[s] = 0;
                }
            }
        });
    }

    fn unregister(&self, tid: Tid) {
        let mut rows = self.rows.lock().unwrap();
        let at = rows
            .iter()
            .position(|r| r.0 == tid)
            .unwrap_or_else(|| panic!("tid {tid} not tracked"));
        rows.swap_remove(at);
    }
}

/// A worker's own data about one of its traced threads (what the daemon
/// would keep beside the ledger: the watch ids armed on it).
#[derive(Clone, Copy)]
struct Local {
    tid: Tid,
    armed: [u64; SLOTS],
}

/// Worker `w` of `workers`: its pid and the tids it owns (every
/// `workers`-th of the T tids, so tids of different workers interleave
/// like the kernel's).
fn worker_locals(w: usize, workers: usize, threads: usize) -> (Pid, Vec<Local>) {
    let pid = 1 + w as Pid;
    let locals = (w..threads)
        .step_by(workers)
        .map(|i| Local {
            tid: 1_000 + i as Tid,
            armed: [0; SLOTS],
        })
        .collect();
    (pid, locals)
}

/// One round of one worker. `phase` is shared by all workers: every
/// worker's threads are registered before anyone reserves, and stay
/// registered until everyone has released, so the accounting holds all T
/// threads while slots change hands (as in `perf bench breakpoint thread`,
/// whose threads all live while breakpoints are set), whatever the
/// scheduler does with W workers on fewer cores.
fn round<A: Accounting>(acc: &A, phase: &Barrier, pid: Pid, w: usize, locals: &mut [Local]) {
    for l in locals.iter() {
        acc.register(pid, l.tid);
    }
    phase.wait();
    for l in locals.iter_mut() {
        for s in 0..SLOTS {
            let id = WatchId(((w as u64) << 8) | (s as u64 + 1));
            let token = acc.reserve(l.tid, id);
            acc.commit(&token);
            l.armed[s] = id.0;
        }
    }
    for l in locals.iter_mut() {
        for s in 0..SLOTS {
            acc.release(l.tid, WatchId(l.armed[s]));
            l.armed[s] = 0;
        }
    }
    phase.wait();
    for l in locals.iter() {
        acc.unregister(l.tid);
    }
    black_box(locals);
}

/// Wall time of `rounds` rounds of the workload on `workers` freshly spawned
/// workers. Spawning, allocation and joining are outside the timed span,
/// which runs from a start barrier to an end barrier shared by all workers.
fn run<A: Accounting>(acc: &A, threads: usize, workers: usize, rounds: u64) -> Duration {
    let barrier = Barrier::new(workers + 1);
    let phase = Barrier::new(workers);
    thread::scope(|s| {
        for w in 0..workers {
            let (barrier, phase) = (&barrier, &phase);
            s.spawn(move || {
                let (pid, mut locals) = worker_locals(w, workers, threads);
                barrier.wait();
                for _ in 0..rounds {
                    round(acc, phase, pid, w, &mut locals);
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

/// Rounds actually run for `asked` requested, for variant `A` at `threads`.
fn capped<A: Accounting>(threads: usize, asked: u64) -> u64 {
    if A::NAME == GlobalLinear::NAME && threads >= 10_000 {
        asked.min(LINEAR_ROUND_CAP)
    } else {
        asked
    }
}

fn bench_variant<A: Accounting>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    acc: &A,
    threads: usize,
    workers: usize,
) {
    g.bench_function(BenchmarkId::new(A::NAME, format!("W={workers}")), |b| {
        b.iter_custom(|asked| {
            let rounds = capped::<A>(threads, asked);
            let t = run(acc, threads, workers, rounds);
            t.mul_f64(asked as f64 / rounds as f64)
        })
    });
}

fn criterion_groups(c: &mut Criterion) {
    let ledger = Ledger::new();
    let linear = GlobalLinear::default();
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("ledger_accounting/T={threads}"));
        g.sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_millis(1500))
            .throughput(Throughput::Elements(OPS_PER_TID * threads as u64));
        for workers in WORKERS {
            bench_variant(&mut g, &ledger, threads, workers);
            bench_variant(&mut g, &Ideal, threads, workers);
            bench_variant(&mut g, &linear, threads, workers);
        }
        g.finish();
    }
}

/// ns per accounting call of one timed run of `rounds` rounds.
fn ns_per_op<A: Accounting>(acc: &A, threads: usize, workers: usize, rounds: u64) -> f64 {
    let t = run(acc, threads, workers, rounds);
    t.as_nanos() as f64 / (rounds * OPS_PER_TID * threads as u64) as f64
}

/// Rounds that make one run last about `target`: doubles the rounds until a
/// run is long enough that the barriers and wake-ups no longer dominate it,
/// then scales.
fn calibrate<A: Accounting>(acc: &A, threads: usize, workers: usize, target: Duration) -> u64 {
    let mut rounds = 1;
    loop {
        let t = run(acc, threads, workers, rounds);
        if t >= target / 4 || rounds >= 1 << 20 {
            let scale = target.as_secs_f64() / t.as_secs_f64().max(1e-9);
            return ((rounds as f64 * scale).ceil() as u64).max(1);
        }
        rounds *= 2;
    }
}

/// `global_linear/ledger` with the harness's own cost (the `ideal` row:
/// barriers, wake-ups, the workers' local data) taken out of both: the
/// ratio of the accounting work alone. "–" where the ledger's part is
/// within the noise of the harness's (at most 1 ns/op).
fn net_ratio(linear_net: f64, ledger_net: f64) -> String {
    if ledger_net > 1.0 {
        format!("{:.1}×", linear_net / ledger_net)
    } else {
        "–".to_string()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The summary pass: per (T, W), the three variants run interleaved, 5
/// times each, each run about 40 ms (at least one round); median ns/op.
fn summary() {
    const REPS: usize = 5;
    let target = Duration::from_millis(40);
    let ledger = Ledger::new();
    let linear = GlobalLinear::default();
    println!();
    println!("## ledger accounting summary (ns per accounting call, median of {REPS} runs)");
    println!();
    println!(
        "| T | W | ideal ns/op | ledger ns/op | global_linear ns/op | ledger − ideal ns/op | ledger/ideal | global_linear/ledger | same, net of ideal |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for threads in THREADS {
        for workers in WORKERS {
            let rl = calibrate(&ledger, threads, workers, target);
            let ri = calibrate(&Ideal, threads, workers, target);
            let rg = calibrate(&linear, threads, workers, target);
            let (mut l, mut i, mut g) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..REPS {
                l.push(ns_per_op(&ledger, threads, workers, rl));
                i.push(ns_per_op(&Ideal, threads, workers, ri));
                g.push(ns_per_op(&linear, threads, workers, rg));
            }
            let (l, i, g) = (median(l), median(i), median(g));
            println!(
                "| {threads} | {workers} | {i:.2} | {l:.1} | {g:.1} | {:.1} | {:.2}× | {:.1}× | {} |",
                l - i,
                l / i,
                g / l,
                net_ratio(g - i, l - i)
            );
        }
    }
    let (p50, p99, max) = ledger.hold_summary();
    println!();
    println!("ledger guard hold time: p50 ≤ {p50} ns, p99 ≤ {p99} ns, max {max} ns");
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c);
    c.final_summary();
    // Only under `cargo bench` (not `cargo test --benches`, `--list`, ...).
    let args: Vec<String> = std::env::args().collect();
    let bench_mode = args.iter().any(|a| a == "--bench")
        && !args
            .iter()
            .any(|a| a == "--test" || a == "--list" || a.starts_with("--profile-time"));
    let wanted = std::env::var("WPD_LEDGER_SUMMARY").map_or(true, |v| v != "0");
    if bench_mode && wanted {
        summary();
        summary_with_kernel();
    }
}
