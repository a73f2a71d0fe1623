//! Spreading a pass of per-thread syscalls over the CPUs ([`fan_out`]).

/// Fewest items per extra thread in [`fan_out`]: below this the thread's
/// start (tens of µs) costs more than the opens it takes over.
const FAN_OUT_MIN: usize = 64;

/// Runs `f` over `items` cut into contiguous chunks, one per CPU we may run
/// on (at most `cpus`), each on its own thread, the first on the caller's;
/// results in chunk order. Spreading perf_event_open over the CPUs does more
/// than divide the work: each open interrupts the CPU its target thread last
/// ran on (`perf_install_in_context`), and an IPI to a CPU busy with another
/// opener costs a fraction of one that has to wake an idle (virtual) CPU.
/// Threads started by a real-time thread inherit its policy.
pub(crate) fn fan_out<T: Sync, R: Send>(
    items: &[T],
    cpus: usize,
    f: impl Fn(&[T]) -> R + Sync,
) -> Vec<R> {
    let most = cpus.min(items.len() / FAN_OUT_MIN);
    if most < 2 {
        // Most passes (one thread, a few): no affinity or cgroup lookups.
        return vec![f(items)];
    }
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = most.min(allowed);
    if workers < 2 {
        return vec![f(items)];
    }
    let size = items.len().div_ceil(workers);
    let f = &f;
    std::thread::scope(|s| {
        let mut chunks = items.chunks(size);
        let first = chunks.next().unwrap_or(&[]);
        // A chunk whose thread could not start runs on the caller's.
        let rest: Vec<_> = chunks
            .map(|c| {
                std::thread::Builder::new()
                    .name("wpd-open".into())
                    .spawn_scoped(s, move || f(c))
                    .map_err(|_| c)
            })
            .collect();
        let mut out = vec![f(first)];
        for h in rest {
            out.push(match h {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(c) => f(c),
            });
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::{FAN_OUT_MIN, fan_out};

    #[test]
    fn fan_out_covers_every_item_once_in_order() {
        for n in [
            0,
            1,
            FAN_OUT_MIN,
            2 * FAN_OUT_MIN - 1,
            2 * FAN_OUT_MIN,
            1_000,
        ] {
            let items: Vec<usize> = (0..n).collect();
            for cpus in 1..=4 {
                let threads = std::sync::Mutex::new(std::collections::HashSet::new());
                let chunks = fan_out(&items, cpus, |c| {
                    threads.lock().unwrap().insert(std::thread::current().id());
                    c.to_vec()
                });
                let flat: Vec<usize> = chunks.iter().flatten().copied().collect();
                assert_eq!(flat, items, "n {n} cpus {cpus}");
                let allowed = std::thread::available_parallelism().map_or(1, |p| p.get());
                let expect = cpus.min(allowed).min(n / FAN_OUT_MIN).max(1);
                assert_eq!(chunks.len(), expect, "n {n} cpus {cpus}");
                assert_eq!(threads.lock().unwrap().len(), expect, "n {n} cpus {cpus}");
            }
        }
    }
}
