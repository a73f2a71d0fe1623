//! A full disk under the state directory: the real daemon on a 4 MiB tmpfs
//! the test fills while hits flow. The journal counts what it cannot write
//! (never a silent drop), leaves its segments readable, recovers by itself
//! once space is freed, and replays every event written before and after;
//! SetWatchpoint, SetPolicy and RemoveWatchpoint answer NOT_SAVED (and
//! change nothing) while the saved state cannot be written. Then a real
//! `fdatasync` failure: ext4 on a loop device whose backing tmpfs fills.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::time::Instant;
use tonic::Code;
use tonic_types::StatusExt;
use wpd_proto::v1::stream_events_response::Event as E;
use wpd_proto::v1::*;
use wpd_tests::{
    Backend, CTarget, Client, Daemon, poll_until, require_root_perf, rpc_ok, unique_temp_dir,
};

const WAIT: Duration = Duration::from_secs(30);

/// A small tmpfs mounted on a directory of its own; unmounted (lazily if
/// still busy) and removed on drop, whatever the test's outcome.
struct SmallFs {
    dir: PathBuf,
    mnt: PathBuf,
}

impl SmallFs {
    fn mount(size: &str) -> Result<SmallFs> {
        let dir = unique_temp_dir("wpd-diskfull")?;
        let mnt = dir.join("mnt");
        std::fs::create_dir(&mnt)?;
        let fs = SmallFs { dir, mnt };
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0700"))
            .arg("wpd-diskfull")
            .arg(&fs.mnt)
            .output()
            .context("running mount")?;
        ensure!(
            out.status.success(),
            "mount -t tmpfs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(fs)
    }

    /// Writes `path` until the filesystem is full (down to the last byte).
    fn fill(&self, path: &Path) -> Result<u64> {
        let mut f = std::fs::File::create(path)?;
        let mut total = 0u64;
        for chunk in [64 << 10, 4096, 512, 1] {
            let buf = vec![0x5au8; chunk];
            loop {
                match f.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => total += n as u64,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => return Err(e).context("filling the filesystem"),
                }
            }
        }
        Ok(total)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn stats(c: &mut Client) -> Result<GetStatsResponse> {
    rpc_ok("GetStats", c.get_stats(GetStatsRequest {})).await
}

fn counter_spec(pid: i32) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: "counter".into(),
        access: Access::Write as i32,
        backend: Backend::Perf as i32,
        ..Default::default()
    }
}

fn reason(s: &tonic::Status) -> String {
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Waits until `f` of the stats holds.
async fn stats_until(
    c: &mut Client,
    what: &str,
    f: impl Fn(&GetStatsResponse) -> bool,
) -> Result<GetStatsResponse> {
    poll_until(WAIT, what, async || {
        let s = stats(c).await?;
        Ok(if f(&s) { Ok(s) } else { Err(format!("{s:?}")) })
    })
    .await
}

/// Waits until the journal's written position stops moving.
async fn settled(c: &mut Client) -> Result<GetStatsResponse> {
    let mut last = u64::MAX;
    poll_until(WAIT, "the journal to settle", async || {
        let s = stats(c).await?;
        let now = s.journal_written_seq;
        let done = now == last;
        last = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(if done {
            Ok(s)
        } else {
            Err(format!("at {now}"))
        })
    })
    .await
}

/// The whole journal replayed: events by sequence number, and gaps.
async fn replay(c: &mut Client) -> Result<(Vec<u64>, Vec<(u64, u64)>)> {
    let mut s = rpc_ok(
        "StreamEvents",
        c.stream_events(StreamEventsRequest {
            raw: true,
            after_seq: Some(0),
            ..Default::default()
        }),
    )
    .await?;
    let (mut seqs, mut gaps) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        ensure!(Instant::now() < end, "replay still going after 120 s");
        match tokio::time::timeout(Duration::from_secs(2), s.message()).await {
            Err(_) | Ok(Ok(None)) => return Ok((seqs, gaps)),
            Ok(Ok(Some(m))) => match m.event {
                Some(E::Dropped(d)) => gaps.push((d.first_seq, d.last_seq)),
                Some(_) => seqs.push(m.seq),
                None => bail!("an empty item: {m:?}"),
            },
            Ok(Err(st)) => bail!("replay failed: {st:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_counted_events_only_and_the_journal_recovers_by_itself() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let fs = SmallFs::mount("4m")?;
    let state = fs.mnt.join("state");
    let filler = fs.mnt.join("filler");
    // Small segments: rotation (a new file) happens while the disk is full.
    let daemon = Daemon::start_with_state_dir(
        &state,
        &[
            "--journal-segment-bytes",
            "262144",
            "--journal-fsync-ms",
            "20",
        ],
    )
    .await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        let wp = rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(counter_spec(t.pid)),
            }),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        t.cmd("spin 1").await?;
        let before = stats_until(&mut c, "hits in the journal", |s| {
            s.journal_written_seq > 2000
        })
        .await?;
        ensure!(before.journal_write_lost == 0, "{before:?}");

        // The disk fills while hits keep coming; 64 KiB of it held back in a file of its
        // own, freed only once the hits have stopped (the journal takes whatever room
        // comes back while they flow, and the API's save below needs some).
        let reserve = fs.mnt.join("reserve");
        std::fs::write(&reserve, vec![0u8; 64 << 10])?;
        let filled = fs.fill(&filler)?;
        let filled_at = Instant::now();
        let full = stats_until(&mut c, "writes failing on the full disk", |s| {
            s.journal_write_lost > 0 && s.journal_write_errors > 0
        })
        .await?;
        eprintln!(
            "filled {filled} bytes; journal written through {} before the first loss",
            full.journal_written_seq
        );

        // What cannot be saved is refused, and changes nothing.
        let r = c
            .set_watchpoint(SetWatchpointRequest {
                spec: Some(counter_spec(t.pid)),
            })
            .await;
        let st = match r {
            Ok(ok) => bail!("SetWatchpoint answered OK on a full disk: {ok:?}"),
            Err(st) => st,
        };
        ensure!(
            st.code() == Code::Unavailable && reason(&st) == "NOT_SAVED",
            "{st:?}"
        );
        ensure!(st.message().contains("No space left"), "{st:?}");
        let r = c
            .set_policy(SetPolicyRequest {
                selector: Some(ProcessSelector {
                    comm: "nothing-like-it".into(),
                    ..Default::default()
                }),
                spec: Some(counter_spec(0)),
            })
            .await;
        ensure!(
            r.as_ref().is_err_and(|st| reason(st) == "NOT_SAVED"),
            "SetPolicy on a full disk: {r:?}"
        );
        let r = c
            .remove_watchpoint(RemoveWatchpointRequest { id: wp.id })
            .await;
        ensure!(
            r.as_ref().is_err_and(|st| reason(st) == "NOT_SAVED"),
            "RemoveWatchpoint on a full disk: {r:?}"
        );
        let l = rpc_ok(
            "ListWatchpoints",
            c.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            l.watchpoints.iter().map(|w| w.id).collect::<Vec<_>>() == vec![wp.id]
                && l.policies.is_empty(),
            "after the refusals: {l:?}"
        );

        // Space comes back: the journal goes on by itself.
        let at_delete = stats(&mut c).await?;
        let lost_while_full = at_delete.journal_write_lost;
        std::fs::remove_file(&filler)?;
        let freed = Instant::now();
        let full_for = filled_at.elapsed();
        stats_until(&mut c, "the journal writing again", |s| {
            s.journal_written_seq > at_delete.journal_written_seq
        })
        .await?;
        let recovered_in = freed.elapsed();
        stats_until(&mut c, "a thousand events written after it", |s| {
            s.journal_written_seq > at_delete.journal_written_seq + 1000
        })
        .await?;
        ensure!(
            daemon.log().contains("journal: writing works again"),
            "no recovery line in the log"
        );
        t.cmd("stop").await?;
        let end = settled(&mut c).await?;
        ensure!(
            end.journal_durable_seq == end.journal_written_seq,
            "durable {} written {}",
            end.journal_durable_seq,
            end.journal_written_seq
        );
        ensure!(end.journal_unsynced == 0, "{end:?}");
        // The API saves again, where there is room.
        std::fs::remove_file(&reserve)?;
        rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(counter_spec(t.pid)),
            }),
        )
        .await?;

        // Every event is replayed or inside a gap, each once, in order;
        // the gaps add up to what was counted lost.
        let (seqs, gaps) = replay(&mut c).await?;
        let last = end.journal_written_seq;
        let mut covered = Vec::with_capacity(last as usize);
        covered.extend(seqs.iter().copied());
        for &(a, b) in &gaps {
            covered.extend(a..=b);
        }
        covered.sort_unstable();
        ensure!(
            covered.len() as u64 >= last
                && covered[..last as usize] == (1..=last).collect::<Vec<_>>()[..],
            "{} events and {} gaps do not cover 1..={last} once each",
            seqs.len(),
            gaps.len()
        );
        ensure!(seqs.windows(2).all(|w| w[0] < w[1]), "out of order");
        let in_gaps: u64 = gaps
            .iter()
            .filter(|(a, _)| *a <= last)
            .map(|(a, b)| b.min(&last) - a + 1)
            .sum();
        let lost = end.journal_write_lost + end.journal_lagged;
        ensure!(
            in_gaps == lost,
            "gaps hold {in_gaps} events, the journal counted {lost} lost ({gaps:?})"
        );
        // Everything written before the disk filled (write_lost was 0: only
        // the writer falling behind the ring could have lost any).
        let before_n = before.journal_written_seq;
        let missing_before = (1..=before_n)
            .filter(|s| seqs.binary_search(s).is_err())
            .count() as u64;
        ensure!(
            missing_before <= end.journal_lagged,
            "{missing_before} events written before the fill are missing"
        );
        let first_after = gaps.iter().map(|g| g.1).max().unwrap_or(0) + 1;
        ensure!(
            seqs.iter()
                .filter(|&&s| s >= first_after && s <= last)
                .count() as u64
                == last + 1 - first_after,
            "events after the recovery are missing"
        );
        eprintln!(
            "disk full: {lost_while_full} events lost while full ({} in all, {:?} full), {} write \
             errors, writing again {recovered_in:?} after the filler was deleted (polled); {} \
             events replayed, {} gaps",
            end.journal_write_lost,
            full_for,
            end.journal_write_errors,
            seqs.len(),
            gaps.len()
        );
        Ok(())
    }
    .await;
    let result = daemon.finish(result);
    drop(t);
    // Restarted on the same directory: nothing torn, nothing cut, the same
    // events.
    let result = match result {
        Ok(()) => restart_check(daemon, &state).await,
        Err(e) => Err(e),
    };
    drop(fs);
    result
}

/// Stops `daemon` and starts another on `state`: its journal holds no torn
/// or damaged record.
async fn restart_check(mut daemon: Daemon, state: &Path) -> Result<()> {
    let mut c = daemon.client().await?;
    let (seqs, _) = replay(&mut c).await?;
    drop(c);
    let status = daemon.terminate(Duration::from_secs(10)).await?;
    ensure!(
        status.success(),
        "the daemon exited {status:?} after the full disk"
    );
    drop(daemon);
    let second = Daemon::start_with_state_dir(state, &[]).await?;
    let result = async {
        let mut c = second.client().await?;
        let s = stats(&mut c).await?;
        ensure!(s.journal_torn == 0, "a damaged tail at restart: {s:?}");
        let (again, _) = replay(&mut c).await?;
        let n = seqs.len();
        ensure!(
            again.len() >= n && again[..n] == seqs[..],
            "{} events after the restart, {n} before",
            again.len()
        );
        Ok(())
    }
    .await;
    second.finish(result)
}

/// An ext4 filesystem on a loop device whose backing file is sparse, on a
/// small tmpfs: filling the tmpfs makes the kernel's writeback of the ext4
/// fail, so that `fdatasync` fails while `write` still succeeds (the page
/// cache takes it). Unmounted, detached and removed on drop.
struct LoopExt4 {
    back: SmallFs,
    mnt: PathBuf,
    device: String,
}

fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    ensure!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl LoopExt4 {
    fn new() -> Result<LoopExt4> {
        let back = SmallFs::mount("80m")?;
        let img = back.mnt.join("ext4.img");
        let img_s = img.to_string_lossy().to_string();
        let mnt = back.dir.join("ext4");
        std::fs::create_dir(&mnt)?;
        // Written whole first, then the free blocks punched out again: the
        // metadata (superblocks, bitmaps, inode tables) is backed, so only
        // the journal's data meets the full disk (a metadata block whose
        // writeback fails is lost without any fdatasync seeing it). No
        // ext4 journal: its failed commit would leave the filesystem
        // read-only for good. Blocks of 4 KiB, not the 1 KiB mke2fs gives
        // so small a filesystem: a 1 KiB directory block holds about 30 of
        // the journal's segment names, and the block the directory grows
        // into once it has more comes from the punched-out space: created
        // after the fill, it was never on the device, and after the remount
        // the directory could not be read (EBADMSG, one CI run). 4 KiB hold
        // about 120, more than the test makes.
        std::fs::write(&img, vec![0u8; 64 << 20])?;
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "4096",
                "-O",
                "^has_journal",
                "-E",
                "nodiscard",
                &img_s,
            ],
        )?;
        let dump = run("dumpe2fs", &[&img_s])?;
        let block: u64 = dump
            .lines()
            .find_map(|l| l.strip_prefix("Block size:"))
            .and_then(|v| v.trim().parse().ok())
            .context("no block size in dumpe2fs")?;
        for l in dump.lines() {
            let Some(ranges) = l.trim().strip_prefix("Free blocks: ") else {
                continue;
            };
            for r in ranges.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                let (a, b): (u64, u64) = (a.parse()?, b.parse()?);
                run(
                    "fallocate",
                    &[
                        "--punch-hole",
                        "-o",
                        &(a * block).to_string(),
                        "-l",
                        &((b - a + 1) * block).to_string(),
                        &img_s,
                    ],
                )?;
            }
        }
        let device = run("losetup", &["-f", "--show", &img_s])?;
        let fs = LoopExt4 { back, mnt, device };
        fs.mount()?;
        Ok(fs)
    }

    fn mount(&self) -> Result<()> {
        run(
            "mount",
            &[
                "-o",
                "errors=continue",
                &self.device,
                &self.mnt.to_string_lossy(),
            ],
        )?;
        Ok(())
    }

    /// Unmounts and mounts again: what is read next comes from the device,
    /// not from the page cache.
    fn remount(&self) -> Result<()> {
        run("umount", &[&self.mnt.to_string_lossy()])?;
        self.mount()
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let mnt = self.mnt.to_string_lossy().to_string();
        if run("umount", &[&mnt]).is_err() {
            let _ = run("umount", &["-l", &mnt]);
        }
        let _ = run("losetup", &["-d", &self.device]);
        // `back` unmounts the tmpfs and removes the directories after this.
    }
}

/// A real `fdatasync` failure (the kernel's writeback meets a full device):
/// counted as not durable, never retried on that file, writing goes on in a
/// new segment and syncs again once the device has room; after a remount
/// the journal opens and replays what the device holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fdatasync_is_counted_and_writing_goes_on() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let fs = LoopExt4::new()?;
    let state = fs.mnt.join("state");
    let filler = fs.back.mnt.join("filler");
    let args = [
        "--journal-fsync-ms",
        "20",
        "--journal-segment-bytes",
        "262144",
    ];
    let mut daemon = Daemon::start_with_state_dir(&state, &args).await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(counter_spec(t.pid)),
            }),
        )
        .await?;
        t.cmd("spin 1").await?;
        let at_fill = stats_until(&mut c, "hits synced", |s| s.journal_durable_seq > 1000).await?;
        // The device under the ext4 fills: writes still land in the page
        // cache, their writeback (and so fdatasync) fails.
        fs.back.fill(&filler)?;
        let failed = stats_until(&mut c, "a failed fdatasync", |s| {
            s.journal_unsynced > 0 && s.journal_write_errors >= 3
        })
        .await?;
        std::fs::remove_file(&filler)?;
        // Room again: writing and syncing go on (in a new segment).
        stats_until(&mut c, "writing again", |s| {
            s.journal_written_seq > failed.journal_written_seq + 100
        })
        .await?;
        t.cmd("stop").await?;
        settled(&mut c).await?;
        let end = stats_until(&mut c, "everything written synced", |s| {
            s.journal_durable_seq == s.journal_written_seq
        })
        .await?;
        ensure!(
            end.journal_segments > at_fill.journal_segments,
            "no new segment after the failed sync: {end:?}"
        );
        ensure!(
            daemon.log().contains("fdatasync failed"),
            "no log line for the failed sync"
        );
        eprintln!(
            "fdatasync failed: {} events unsynced, {} lost, {} write errors; durable {} of {} \
             in {} segments",
            end.journal_unsynced,
            end.journal_write_lost,
            end.journal_write_errors,
            end.journal_durable_seq,
            end.journal_written_seq,
            end.journal_segments
        );
        Ok(end)
    }
    .await;
    let end = daemon.finish(result)?;
    drop(t);
    let status = daemon.terminate(Duration::from_secs(10)).await?;
    ensure!(status.success(), "the daemon exited {status:?}");
    drop(daemon);
    // The journal opens again from what is on the device (not the page
    // cache), damaged stretches and all, and replays.
    fs.remount()?;
    let second = Daemon::start_with_state_dir(&state, &[]).await?;
    let result = async {
        let mut c = second.client().await?;
        let (seqs, gaps) = replay(&mut c).await?;
        // Through the last event written (and those of the shutdown).
        ensure!(
            seqs.last() >= Some(&end.journal_written_seq),
            "replayed through {:?}, written {}",
            seqs.last(),
            end.journal_written_seq
        );
        let on_device = seqs.partition_point(|&s| s <= end.journal_durable_seq) as u64;
        let missing = end.journal_durable_seq - on_device;
        eprintln!(
            "after a remount: {} events of 1..={} on the device, {missing} missing in {} gaps \
             ({} counted unsynced)",
            on_device,
            end.journal_durable_seq,
            gaps.len(),
            end.journal_unsynced
        );
        Ok(())
    }
    .await;
    let result = second.finish(result);
    drop(second);
    drop(fs);
    result
}
