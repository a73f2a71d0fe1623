//! The deployment files where they run: `deploy/wpd.socket` and `deploy/wpd.service` installed
//! as README.md says under a real systemd as PID 1, and the DaemonSet's container command line
//! and capability set in the pid namespace of the node it watches, both in a Debian system
//! the test boots.
//!
//! **The booted system.** A minimal Debian root filesystem (`mmdebstrap --variant=minbase
//! --include=systemd,systemd-sysv,dbus,sudo`, of the host's own Debian release so that the
//! build's binaries find the C library they were linked against) is built once and kept in
//! `/var/cache/wpd-tests/rootfs-<release>-<hash of the command line>`: built in a temporary
//! directory beside it and renamed into place, under a lock, with a marker written last, so a
//! directory found there is complete (one without the marker is built again). Each test boots
//! it on an overlay whose upper directory is its own (runs never see one another's changes),
//! with `/lib/systemd/systemd --system` as PID 1 of new pid, mount, cgroup, network, UTS and
//! IPC namespaces (`unshare`), in a cgroup of its own that is the root of its cgroup
//! namespace. [`BOOT_SCRIPT`] says what is mounted there and why. systemd-nspawn is not used:
//! it refuses to run on a host that was not itself booted with systemd, as the test machines
//! are not.
//! Commands run inside through `nsenter` into every namespace of that init and its root.
//!
//! **systemd.** The README's install block, verbatim (`sudo` included), run in a checkout laid
//! out in `/src` (`deploy/` and the build's `wpd` and `wpctl` as `target/release/`): then
//! socket activation (the service inactive until `wpctl health` connects, then started by
//! the socket and serving the socket it was handed), `Type=notify` readiness, the socket's
//! owner, group and mode (a member of group `wpd` connects, another user is refused), the
//! capability set and `NoNewPrivileges=` the daemon really has, the perf backend's per-thread
//! BPF path and the ptrace backend (signal stops) hitting multi-threaded targets started in
//! the booted system (`systemd-run --pipe`), state files private (0600 files, 0700
//! directories under `/var/lib/wpd`), a restart after `systemctl kill -s KILL` with both
//! watchpoints set again and hitting and the targets alive, the watchdog killing and
//! restarting a daemon stopped with SIGSTOP, and `systemctl stop` detaching cleanly.
//!
//! **The DaemonSet.** What `deploy/kubernetes/daemonset.yaml` says of its container (read with
//! PyYAML), played by hand in the booted system, which stands for the node: `hostPID: true` is
//! the node's pid namespace (the container gets no pid namespace of its own; the targets are
//! the node's processes), the container's new mount, network, UTS and IPC namespaces whose root
//! is the image (the node's root filesystem alone, remounted read-only:
//! `readOnlyRootFilesystem`), with its `proc`, `sysfs`, a small `/dev`, and the `hostPath`
//! volumes at their `mountPath`s; the command line, environment and capability set exactly as
//! written (`setpriv`: bounding set = the added capabilities, no inheritable or ambient ones,
//! uid and gid 0, no supplementary groups, `no_new_privs` for `allowPrivilegeEscalation:
//! false`). Checked: the probes' command answers, the capabilities the daemon has, watches and
//! hits with both backends on targets of the node named by the node's pids, private state files
//! in the `hostPath`, the container killed (SIGKILL) and started again on the same `hostPath`s
//! with both watchpoints set again and hitting, and SIGTERM (what the kubelet sends) detaching
//! everything with exit status 0. Not reproduced: the pod's cgroup and resource limits, the
//! runtime's seccomp, AppArmor and SELinux settings (the DaemonSet asks for `Unconfined` and
//! `spc_t`, which is no confinement), the image itself, and the metrics port's traffic (the
//! pod's network namespace has only a loopback that is down; the daemon's listener is bound).
//! Where this machine's own bounding set lacks a capability the DaemonSet adds (on the test
//! machines CAP_SYS_RESOURCE: no process there has it in its bounding set, so neither the
//! booted systemd nor anything under it can hold it), nothing can grant it: the daemon runs
//! without it, exactly as the systemd unit does, the test says so on stderr and checks the rest
//! of the set.
//!
//! **Teardown**, by guards, on every path including panics: SIGKILL to the namespace's init
//! takes every process of its pid namespace with it (the daemons and targets started there
//! too; `unshare --kill-child` and the parent-death signal do the same if the test process
//! dies); every mount was made inside the boot's own mount namespace and goes with its last
//! process (the guard waits until no process is left in it); the boot's cgroup is emptied
//! with `cgroup.kill` and removed; the overlay's directories are deleted. On failure the
//! booted system's journal (`journalctl -b`), `systemctl status wpd` and the console are
//! printed.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;
use tokio::time::Instant;
use wpd_tests::{
    CmdOutput, TargetProc, bin_path, machine_skip, peer_program, require_peer, require_root_perf,
    unique_temp_dir,
};

use crate::deploy::{deploy_dir, unit_capabilities};

/// Where root filesystems are kept between runs.
const CACHE_DIR: &str = "/var/cache/wpd-tests";
/// The packages on top of `minbase`: systemd as init, D-Bus (systemctl's bus), and sudo (the
/// README's install block runs with it).
const PACKAGES: &str = "systemd,systemd-sysv,dbus,sudo";
/// Written last into a finished root filesystem.
const COMPLETE_MARK: &str = ".wpd-tests-complete";
/// PATH of every command run in the booted system.
const PATH_INSIDE: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where the targets' program is put in the booted system.
const TARGET_INSIDE: &str = "/usr/local/libexec/wpd-tests/wpd-target";
/// How long one command in the booted system may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the tests wait for a state they expect (a restart, hits, a reply).
const WAIT: Duration = Duration::from_secs(60);

/// Run by `sh` as the first process of the new namespaces, with the overlay's lower, upper and
/// work directories and its mount point: mounts the system's root and what systemd expects
/// to find mounted, makes the overlay the namespace's root (`pivot_root`, not `chroot`: the
/// root of the mount namespace is then the system's own, so paths in `/proc/PID/maps` read by
/// a daemon in another mount namespace are the system's paths, not the host's), and execs
/// systemd. Every mount is in the new mount namespace (`unshare` makes it private): nothing
/// reaches the host's.
///
/// - `/proc` of the new pid namespace, with `/proc/sys` read-only, as container managers do:
///   systemd-sysctl and the like must not change the host kernel's settings (the units that
///   write there are skipped: `ConditionPathIsReadWrite=/proc/sys`).
/// - `sysfs` read-only (the new network namespace's view) and, below it, a cgroup2 mount:
///   the cgroup namespace's root is the cgroup the test made for this boot, so systemd
///   manages that subtree as its whole hierarchy.
/// - A `/dev` of a few nodes bound from the host's, with a private devpts, rather than the
///   host's devtmpfs. No `/dev/console`: systemd logs to the journal, the console getty is
///   skipped.
/// - `container=wpd-tests` in systemd's environment: it runs as in a container
///   (`systemd-detect-virt` says `container-other`), skipping what only a host does.
const BOOT_SCRIPT: &str = r#"set -eu
lower=$1 upper=$2 work=$3 root=$4
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
mount -t proc proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
mount -t sysfs -o ro sysfs "$root/sys"
mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for n in null zero full random urandom tty; do
    touch "$root/dev/$n"
    mount --bind "/dev/$n" "$root/dev/$n"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
cd "$root"
pivot_root . mnt
cd /
umount -l /mnt
exec /lib/systemd/systemd --system
"#;

/// The capabilities by number (`linux/capability.h`), without `CAP_`.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The bit mask of capabilities named (`PERFMON`, `CAP_BPF`, ...), as `/proc/PID/status`
/// shows sets.
fn cap_mask<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<u64> {
    let mut mask = 0u64;
    for name in names {
        let bare = name.trim_start_matches("CAP_").to_ascii_uppercase();
        let bit = CAPABILITIES
            .iter()
            .position(|c| *c == bare)
            .ok_or_else(|| anyhow!("unknown capability {name:?}"))?;
        mask |= 1 << bit;
    }
    Ok(mask)
}

/// The names of the capabilities in `mask`.
fn cap_names(mask: u64) -> Vec<&'static str> {
    CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1 << bit) != 0)
        .map(|(_, name)| *name)
        .collect()
}

/// A line `Key:\tvalue` of a `/proc/PID/status` text.
fn status_field<'a>(status: &'a str, key: &str) -> Result<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
        .ok_or_else(|| anyhow!("no {key} in\n{status}"))
}

/// A capability set of a `/proc/PID/status` text (`CapEff`, ...).
fn status_caps(status: &str, key: &str) -> Result<u64> {
    let hex = status_field(status, key)?;
    u64::from_str_radix(hex, 16).with_context(|| format!("{key}: {hex:?}"))
}

// ---------------------------------------------------------------------------------------
// The root filesystem
// ---------------------------------------------------------------------------------------

/// The host's Debian release (`VERSION_CODENAME` of `/etc/os-release`), else bookworm.
fn host_release() -> String {
    let os = fs::read_to_string("/etc/os-release").unwrap_or_default();
    let get = |key: &str| {
        os.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
    };
    match (get("ID").as_deref(), get("VERSION_CODENAME")) {
        (Some("debian"), Some(codename)) if !codename.is_empty() => codename,
        _ => "bookworm".to_string(),
    }
}

/// 64-bit FNV-1a: a hash that stays the same from one build of the tests to the next.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// An exclusive `flock` on a file, released on drop (the file closes).
struct FileLock(#[allow(dead_code)] fs::File);

impl FileLock {
    fn exclusive(path: &Path) -> Result<FileLock> {
        use std::os::fd::AsRawFd;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("locking {}", path.display()));
        }
        Ok(FileLock(file))
    }
}

/// Makes `cmd`'s child die with the thread that spawned it (`PR_SET_PDEATHSIG`).
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; this runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The cached root filesystem, built first if it is not there (or not complete). Building
/// needs mmdebstrap (`scripts/setup` installs it) and Debian's package mirror.
fn root_filesystem() -> Result<PathBuf> {
    let mmdebstrap = peer_program("mmdebstrap", "Debian: mmdebstrap");
    let release = host_release();
    let args = [
        "--variant=minbase".to_string(),
        format!("--include={PACKAGES}"),
        release.clone(),
    ];
    let line = format!("mmdebstrap {} DIR", args.join(" "));
    let cache = Path::new(CACHE_DIR);
    fs::create_dir_all(cache).with_context(|| format!("creating {CACHE_DIR}"))?;
    let dir = cache.join(format!("rootfs-{release}-{:016x}", fnv1a(line.as_bytes())));
    // One builder at a time; the others wait here and find it built.
    let _lock = FileLock::exclusive(&cache.join(".lock"))?;
    if dir.join(COMPLETE_MARK).is_file() {
        return Ok(dir);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    // Builds cut short (the lock is ours: nobody is building now).
    for entry in fs::read_dir(cache)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".build-") {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    let tmp = cache.join(format!(".build-{}", std::process::id()));
    eprintln!(
        "sysboot: building the root filesystem ({line}) into {}",
        dir.display()
    );
    let started = std::time::Instant::now();
    let mut cmd = Command::new(&mmdebstrap);
    cmd.args(&args).arg(&tmp).stdin(Stdio::null());
    die_with_parent(&mut cmd);
    let out = cmd.output().context("running mmdebstrap")?;
    if !out.status.success() {
        let _ = fs::remove_dir_all(&tmp);
        let text = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        bail!(
            "`{line}` failed ({}); it needs Debian's package mirror:\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    fs::write(tmp.join(COMPLETE_MARK), format!("{line}\n"))?;
    fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    eprintln!(
        "sysboot: root filesystem built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

// ---------------------------------------------------------------------------------------
// The booted system
// ---------------------------------------------------------------------------------------

/// The cgroup2 hierarchy's mount point here, and this process's cgroup in it.
fn own_cgroup2() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

/// The first child of `pid`, if it has one yet.
fn first_child(pid: u32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Single quotes for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Copies `src` to `dst` (parents created) with mode `mode`.
fn put_file(src: &Path, dst: &Path, mode: u32) -> Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Copies the directory `src` into `dst`, recursively.
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let to = dst.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &to)?;
        } else {
            put_file(&entry.path(), &to, 0o644)?;
        }
    }
    Ok(())
}

/// Kills what is left in `cgroup` (`cgroup.kill`) and removes it with its descendants,
/// deepest first.
fn remove_cgroup(cgroup: &Path) {
    let _ = fs::write(cgroup.join("cgroup.kill"), "1");
    let mut dirs = Vec::new();
    let mut stack = vec![cgroup.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        dirs.push(d);
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for d in dirs {
        while fs::remove_dir(&d).is_err() && d.exists() {
            if std::time::Instant::now() >= deadline {
                eprintln!("sysboot: could not remove the cgroup {}", d.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Removes the cgroups of boots whose test process is gone (killed before its guards ran:
/// its boot died with it, by the parent-death signals, but not its cgroup).
fn remove_stale_cgroups(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("wpd-sysboot-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            remove_cgroup(&entry.path());
        }
    }
}

/// A Debian system booted with systemd as PID 1 in namespaces of its own (see the module's
/// documentation). Dropping it tears everything down.
struct Boot {
    /// upper/, work/, root/ (the overlay's mount point, seen only inside) and console.log.
    dir: PathBuf,
    /// `unshare`, the parent of the namespace's init.
    unshare: Option<Child>,
    /// systemd's pid here (PID 1 inside).
    init: Option<i32>,
    /// The boot's cgroup here.
    cgroup: Option<PathBuf>,
    /// `mnt:[...]` of the boot's mount namespace.
    mnt_ns: Option<String>,
}

static BOOTS: AtomicU32 = AtomicU32::new(0);

impl Boot {
    /// Boots `rootfs` on a fresh overlay whose upper directory `prepare` fills first, and waits
    /// until systemd says the system is running (or degraded).
    async fn start(rootfs: &Path, prepare: impl FnOnce(&Path) -> Result<()>) -> Result<Boot> {
        let unshare = peer_program("unshare", "Debian: util-linux");
        peer_program("nsenter", "Debian: util-linux");
        let mut boot = Boot {
            dir: unique_temp_dir("wpd-sysboot")?,
            unshare: None,
            init: None,
            cgroup: None,
            mnt_ns: None,
        };
        for d in ["upper", "work", "root"] {
            fs::create_dir(boot.dir.join(d))?;
        }
        prepare(&boot.dir.join("upper")).context("preparing the overlay's upper directory")?;

        let parent = own_cgroup2().ok_or_else(|| anyhow!("no cgroup2 hierarchy mounted here"))?;
        remove_stale_cgroups(&parent);
        let cgroup = parent.join(format!(
            "wpd-sysboot-{}-{}",
            std::process::id(),
            BOOTS.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&cgroup).with_context(|| format!("creating {}", cgroup.display()))?;
        boot.cgroup = Some(cgroup.clone());

        let console = fs::File::create(boot.dir.join("console.log"))?;
        let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes())?;
        let mut cmd = Command::new(&unshare);
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--propagation",
            "private",
            "--cgroup",
            "--net",
            "--uts",
            "--ipc",
            "--",
            "/bin/sh",
            "-c",
            BOOT_SCRIPT,
            "sh",
        ])
        .arg(rootfs)
        .arg(boot.dir.join("upper"))
        .arg(boot.dir.join("work"))
        .arg(boot.dir.join("root"))
        .env_clear()
        .env("PATH", PATH_INSIDE)
        .env("container", "wpd-tests")
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .process_group(0);
        die_with_parent(&mut cmd);
        // SAFETY: open, write and close are async-signal-safe; the path was made before fork.
        unsafe {
            cmd.pre_exec(move || {
                // Into the boot's cgroup before `unshare --cgroup` makes it the namespace's
                // root ("0": the writing process).
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting unshare")?;
        let unshare_pid = child.id();
        boot.unshare = Some(child);

        // The namespace's init: unshare's child, running systemd once the script is done.
        let deadline = Instant::now() + WAIT;
        let init = loop {
            if let Some(st) = boot
                .unshare
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "the boot ended ({st}) before systemd started:\n{}",
                    boot.console()
                );
            }
            if let Some(pid) = first_child(unshare_pid) {
                let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                if exe.to_string_lossy().ends_with("/lib/systemd/systemd") {
                    break pid;
                }
            }
            ensure!(
                Instant::now() < deadline,
                "systemd did not start within {WAIT:?}:\n{}",
                boot.console()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        boot.init = Some(init);
        boot.mnt_ns = fs::read_link(format!("/proc/{init}/ns/mnt"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());

        // Running, or degraded: either way booted. Until systemd listens, systemctl cannot
        // connect: tried again.
        let state = loop {
            let out = boot
                .run(&["systemctl", "is-system-running", "--wait"])
                .await?;
            let state = out.stdout.trim().to_string();
            if matches!(state.as_str(), "running" | "degraded") {
                break state;
            }
            ensure!(
                Instant::now() < deadline,
                "the booted system is not running after {WAIT:?}: {state:?} {}",
                out.stderr
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if state == "degraded" {
            let failed = boot.run(&["systemctl", "--failed", "--no-pager"]).await?;
            eprintln!("sysboot: booted, degraded:\n{}", failed.stdout);
        }
        Ok(boot)
    }

    /// systemd's pid here.
    fn init(&self) -> i32 {
        self.init.expect("a booted system has an init")
    }

    /// `nsenter` into every namespace and the root of the booted system's init.
    fn nsenter_args(&self) -> Vec<String> {
        [
            "--target".to_string(),
            self.init().to_string(),
            "--pid".into(),
            "--mount".into(),
            "--cgroup".into(),
            "--net".into(),
            "--uts".into(),
            "--ipc".into(),
            "--root".into(),
            "--wd".into(),
            "--".into(),
        ]
        .into()
    }

    /// Runs `args` in the booted system, as root, with a clean environment.
    async fn run(&self, args: &[&str]) -> Result<CmdOutput> {
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.args(self.nsenter_args())
            .args(args)
            .env_clear()
            .env("PATH", PATH_INSIDE)
            .env("SYSTEMD_COLORS", "0")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
            .await
            .map_err(|_| {
                anyhow!(
                    "`{}` in the booted system did not finish within {COMMAND_TIMEOUT:?}",
                    args.join(" ")
                )
            })?
            .context("running nsenter")?;
        Ok(CmdOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Like [`Boot::run`], failing unless it exits 0; its stdout.
    async fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args).await?;
        ensure!(
            out.code == Some(0),
            "`{}` in the booted system exited with {:?}:\n{}{}",
            args.join(" "),
            out.code,
            out.stdout,
            out.stderr
        );
        Ok(out.stdout)
    }

    /// A shell script in the booted system (`sh -ec`), failing unless it exits 0; its stdout.
    async fn sh(&self, script: &str) -> Result<String> {
        self.ok(&["sh", "-ec", script]).await
    }

    /// `systemctl show` of `props` of `unit`.
    async fn show(&self, unit: &str, props: &[&str]) -> Result<BTreeMap<String, String>> {
        let text = self
            .ok(&["systemctl", "show", unit, "-p", &props.join(",")])
            .await?;
        Ok(text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// `wpctl --json ARGS` in the booted system (default endpoint, as root), parsed.
    async fn wpctl_json(&self, args: &[&str]) -> Result<Value> {
        let mut full = vec!["wpctl", "--json"];
        full.extend_from_slice(args);
        let out = self.ok(&full).await?;
        serde_json::from_str(&out).with_context(|| format!("parsing {full:?}: {out}"))
    }

    /// `/proc/PID/FILE` of the booted system's process `pid` (its number there).
    fn proc_file(&self, pid: i64, file: &str) -> Result<String> {
        let path = format!("/proc/{}/root/proc/{pid}/{file}", self.init());
        fs::read_to_string(&path).with_context(|| format!("reading {path}"))
    }

    /// `wpd-target --threads N` started in the booted system as the transient service `unit`
    /// (`systemd-run --pipe`: its stdin and stdout are the test's pipes), each worker storing
    /// every 10 ms: hits enough, and little load for the ptrace backend's stops beside the
    /// other tests.
    async fn start_target(&self, unit: &str, threads: usize) -> Result<TargetProc> {
        let mut args = self.nsenter_args();
        let threads = threads.to_string();
        args.extend(
            [
                "systemd-run",
                "--pipe",
                "--quiet",
                &format!("--unit={unit}"),
                TARGET_INSIDE,
                "--threads",
                &threads,
                "--interval-us",
                "10000",
            ]
            .map(str::to_string),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        TargetProc::start_via(Path::new("nsenter"), &args)
            .await
            .with_context(|| format!("starting {unit} in the booted system"))
    }

    /// What systemd printed on the console (its own errors before the journal runs).
    fn console(&self) -> String {
        fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// The journal of this boot, `systemctl status wpd` and the console, for a failure's
    /// report (blocking: also used from `Drop`).
    fn diagnostics(&self) -> String {
        let Some(init) = self.init else {
            return format!("----- console -----\n{}", self.console());
        };
        let run = |args: &[&str]| {
            let out = Command::new("nsenter")
                .args(self.nsenter_args())
                .args(["timeout", "20"])
                .args(args)
                .env_clear()
                .env("PATH", PATH_INSIDE)
                .env("SYSTEMD_COLORS", "0")
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(o) => {
                    String::from_utf8_lossy(&o.stdout).into_owned()
                        + &String::from_utf8_lossy(&o.stderr)
                }
                Err(e) => format!("(nsenter into {init} failed: {e})"),
            }
        };
        format!(
            "----- journalctl -b (booted system) -----\n{}\n----- systemctl status wpd -----\n{}\n----- console -----\n{}\n-----",
            run(&["journalctl", "-b", "--no-pager", "-o", "short-monotonic"]),
            run(&[
                "systemctl",
                "status",
                "wpd.socket",
                "wpd.service",
                "--no-pager",
                "-l"
            ]),
            self.console()
        )
    }

    /// Prints the diagnostics when `result` is an error; returns it.
    fn finish(&self, result: Result<()>) -> Result<()> {
        if result.is_err() {
            eprintln!("{}", self.diagnostics());
        }
        result
    }

    /// Pids here of processes still in the boot's mount namespace.
    fn processes_in_mount_ns(&self) -> Vec<i32> {
        let Some(ns) = &self.mnt_ns else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                fs::read_link(format!("/proc/{pid}/ns/mnt"))
                    .is_ok_and(|l| l.to_string_lossy() == ns.as_str())
            })
            .collect()
    }
}

impl Drop for Boot {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.diagnostics());
        }
        // The namespace's init: the kernel kills every other process of its pid namespace.
        if let Some(init) = self.init {
            // SAFETY: kill has no memory-safety preconditions; init is the child of our
            // unreaped child `unshare`, which cannot have reaped and replaced it while it is
            // still waiting for it.
            unsafe { libc::kill(init, libc::SIGKILL) };
        }
        if let Some(mut child) = self.unshare.take() {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() {
                if std::time::Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Whatever is left in the boot's cgroup, then the cgroups.
        if let Some(cgroup) = self.cgroup.take() {
            remove_cgroup(&cgroup);
        }
        // Its mounts go with the last process of its mount namespace.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.processes_in_mount_ns();
            if left.is_empty() {
                break;
            }
            if std::time::Instant::now() >= deadline {
                eprintln!(
                    "sysboot: processes {left:?} are still in the boot's mount namespace {:?}",
                    self.mnt_ns
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------
// Watchpoints and hits through wpctl
// ---------------------------------------------------------------------------------------

/// `wpctl watch` on the target's `VARS[0]` (every worker stores there), process-wide, with
/// `backend` if given: the watchpoint's id.
async fn watch_counter(boot: &Boot, target: &TargetProc, backend: Option<&str>) -> Result<u64> {
    let pid = target.pid.to_string();
    let addr = format!("{:#x}", target.vars[0]);
    let mut args = vec!["watch", "--pid", pid.as_str(), "--addr", addr.as_str()];
    if let Some(b) = backend {
        args.extend(["--backend", b]);
    }
    let resp = boot.wpctl_json(&args).await?;
    let wp = &resp["watchpoint"];
    let want = backend.unwrap_or("perf");
    ensure!(
        wp["backend"] == want && wp["process_wide"] == true,
        "expected a process-wide {want} watchpoint: {resp}"
    );
    ensure!(
        wp["armed_threads"].as_u64() == Some(target.threads as u64 + 1),
        "armed on {} threads, the target has {}: {resp}",
        wp["armed_threads"],
        target.threads + 1
    );
    wp["id"].as_u64().ok_or_else(|| anyhow!("no id in {resp}"))
}

/// Waits until `wpctl last ID` holds hits of the target's workers storing values above
/// `above`, from at least two threads, each with the target's pid, `backend` and program;
/// returns the threads seen.
async fn wait_for_hits(
    boot: &Boot,
    id: u64,
    target: &TargetProc,
    backend: &str,
    above: u64,
) -> Result<BTreeSet<i64>> {
    let deadline = Instant::now() + WAIT;
    let id = id.to_string();
    loop {
        let resp = boot.wpctl_json(&["last", &id]).await?;
        let hits = resp["hits"]
            .as_array()
            .ok_or_else(|| anyhow!("no hits list in {resp}"))?;
        let mut tids = BTreeSet::new();
        for h in hits {
            ensure!(
                h["pid"].as_i64() == Some(i64::from(target.pid)) && h["backend"] == backend,
                "a hit of watchpoint {id} with another pid or backend than {} on {backend}: {h}",
                target.pid
            );
            // The program as the booted system names it: the daemon read the target's maps
            // from its own mount namespace.
            ensure!(
                h["location"]["module"] == TARGET_INSIDE,
                "a hit of watchpoint {id} located in another module than {TARGET_INSIDE}: {h}"
            );
            if h["value_le"].as_u64().is_some_and(|v| v > above) {
                tids.extend(h["tid"].as_i64());
            }
        }
        tids.remove(&i64::from(target.pid));
        if tids.len() >= 2 {
            return Ok(tids);
        }
        ensure!(
            Instant::now() < deadline,
            "watchpoint {id}: no hits above {above} from two worker threads within {WAIT:?}: {resp}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails unless every file under `dir` in the booted system is 0600 and every directory 0700,
/// and `must` are among them.
async fn check_private(boot: &Boot, dir: &str, must: &[&str]) -> Result<()> {
    let listing = boot.ok(&["find", dir, "-printf", "%m %y %P\\n"]).await?;
    let mut seen = BTreeSet::new();
    for line in listing.lines() {
        let mut words = line.splitn(3, ' ');
        let (mode, kind, path) = (
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default(),
        );
        let want = if kind == "d" { "700" } else { "600" };
        ensure!(
            mode == want,
            "{dir}/{path} has mode {mode}, not {want}:\n{listing}"
        );
        seen.insert(path.to_string());
    }
    for m in must {
        ensure!(
            seen.iter()
                .any(|p| p == m || p.starts_with(&format!("{m}/"))),
            "{dir}/{m} is missing:\n{listing}"
        );
    }
    Ok(())
}

/// Fails unless the target answers and every one of its threads is untraced, read from the
/// booted system's `/proc`.
async fn check_alive_untraced(boot: &Boot, target: &mut TargetProc) -> Result<()> {
    target.ping().await.context("the target after the daemon")?;
    let tasks = format!("/proc/{}/root/proc/{}/task", boot.init(), target.pid);
    for entry in fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
        let tid = entry?.file_name().to_string_lossy().into_owned();
        let status = boot.proc_file(i64::from(target.pid), &format!("task/{tid}/status"))?;
        let tracer = status_field(&status, "TracerPid")?;
        ensure!(
            tracer == "0",
            "thread {tid} of {} is still traced by {tracer}",
            target.pid
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// systemd
// ---------------------------------------------------------------------------------------

/// The README's install block (the `sh` block of "**systemd.**").
fn readme_install_block() -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = fs::read_to_string(&path)?;
    let from = readme
        .find("**systemd.**")
        .ok_or_else(|| anyhow!("README.md has no **systemd.** paragraph"))?;
    let rest = &readme[from..];
    let open = rest
        .find("```sh\n")
        .ok_or_else(|| anyhow!("no ```sh block after **systemd.** in README.md"))?
        + "```sh\n".len();
    let len = rest[open..]
        .find("```")
        .ok_or_else(|| anyhow!("the install block of README.md is not closed"))?;
    let block = rest[open..open + len].to_string();
    for step in [
        "target/release/wpd",
        "deploy/wpd.socket",
        "systemd-sysusers",
        "systemctl enable --now wpd.socket",
    ] {
        ensure!(
            block.contains(step),
            "README.md's install block no longer has {step:?}: update this test\n{block}"
        );
    }
    Ok(block)
}

/// Fills the overlay's upper directory: the checkout the README's block runs in (`/src`:
/// `deploy/` and this build's `wpd` and `wpctl`, whatever its profile, where the README's
/// release build puts them), and the targets' program.
fn lay_out_checkout(upper: &Path) -> Result<()> {
    copy_tree(&deploy_dir(), &upper.join("src/deploy"))?;
    for bin in ["wpd", "wpctl"] {
        put_file(
            &bin_path(bin),
            &upper.join("src/target/release").join(bin),
            0o755,
        )?;
    }
    put_file(
        &bin_path("wpd-target"),
        &upper.join(TARGET_INSIDE.trim_start_matches('/')),
        0o755,
    )
}

/// The watchdog's period for the checks after the drop-in: short, so that a daemon stopped
/// with SIGSTOP is killed in seconds rather than after the unit's 30 s; long enough that a
/// ping late by a whole interval (the daemon pings every half period) on a loaded machine is
/// not taken for a hang.
const SHORT_WATCHDOG: &str = "5s";

/// Waits until `wpd.service` runs with a main process other than `old` (a restart); its
/// `systemctl show` of MainPID, NRestarts, ActiveState and SubState.
async fn wait_restarted(boot: &Boot, old: &str) -> Result<BTreeMap<String, String>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = boot
            .show(
                "wpd.service",
                &["MainPID", "NRestarts", "ActiveState", "SubState"],
            )
            .await?;
        let pid = s.get("MainPID").map(String::as_str).unwrap_or("0");
        if pid != old && pid != "0" && s["ActiveState"] == "active" && s["SubState"] == "running" {
            return Ok(s);
        }
        ensure!(
            Instant::now() < deadline,
            "wpd.service was not restarted within {WAIT:?} (main process was {old}): {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the journal of `wpd.service` (the daemon's output and systemd's messages
/// about it) has every one of `needles`; fails with `what` and the journal.
async fn wait_journal(boot: &Boot, needles: &[&str], what: &str) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = boot
            .ok(&[
                "journalctl",
                "-b",
                "-u",
                "wpd.service",
                "-o",
                "cat",
                "--no-pager",
            ])
            .await?;
        if needles.iter().all(|n| log.contains(n)) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what} (no {needles:?} within {WAIT:?}):\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `wpctl list` shows every watchpoint of `ids` again (set again after a restart).
async fn wait_restored(boot: &Boot, ids: &[u64]) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let list = boot.wpctl_json(&["list"]).await?;
        let have: BTreeSet<u64> = list["watchpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w["id"].as_u64())
            .collect();
        if ids.iter().all(|id| have.contains(id)) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "watchpoints {ids:?} not set again within {WAIT:?}: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After a restart: both watchpoints set again under their ids, the targets alive, and stores
/// made after the restart caught on each (values above what the counter read once the daemon
/// was back).
async fn check_set_again(boot: &Boot, watched: &mut [(&mut TargetProc, u64, &str)]) -> Result<()> {
    let ids: Vec<u64> = watched.iter().map(|(_, id, _)| *id).collect();
    wait_restored(boot, &ids).await?;
    for (target, id, backend) in watched.iter_mut() {
        let (counter, _) = target.ping().await?;
        wait_for_hits(boot, *id, target, backend, counter).await?;
    }
    Ok(())
}

/// The systemd units installed in a booted Debian exactly as README.md's block says, and
/// everything they promise, under systemd as PID 1: see the module's documentation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_units_installed_as_the_readme_says() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    if own_cgroup2().is_none() {
        machine_skip("no cgroup2 hierarchy mounted here: systemd needs one to boot");
        return Ok(());
    }
    let install = readme_install_block()?;
    let rootfs = tokio::task::block_in_place(root_filesystem)?;
    let boot = Boot::start(&rootfs, lay_out_checkout).await?;
    let result = systemd_checks(&boot, &install).await;
    boot.finish(result)
}

async fn systemd_checks(boot: &Boot, install: &str) -> Result<()> {
    // The README's last step adds alice to the group; she must exist. bob never joins it.
    boot.ok(&["useradd", "alice"]).await?;
    boot.ok(&["useradd", "bob"]).await?;
    boot.sh(&format!("cd /src\n{install}")).await?;

    // Socket activation: the socket listens, systemd's, with the unit's owner and mode; the
    // service waits for a first connection.
    let socket = boot
        .show("wpd.socket", &["ActiveState", "SubState"])
        .await?;
    ensure!(
        socket["ActiveState"] == "active" && socket["SubState"] == "listening",
        "wpd.socket: {socket:?}"
    );
    let before = boot.show("wpd.service", &["ActiveState"]).await?;
    ensure!(
        before["ActiveState"] == "inactive",
        "wpd.service runs before any connection: {before:?}"
    );
    let mode = boot
        .ok(&["stat", "-c", "%a %U %G %F", "/run/wpd/wpd.sock"])
        .await?;
    ensure!(
        mode.trim() == "660 root wpd socket",
        "/run/wpd/wpd.sock: {mode}"
    );
    let health = boot.ok(&["wpctl", "health"]).await?;
    ensure!(
        health.trim() == "serving at unix:/run/wpd/wpd.sock",
        "wpctl health: {health}"
    );
    // Started by the socket, ready (Type=notify: active only once READY=1 came, which may
    // follow the first answer by a moment), and serving the socket it was handed.
    let deadline = Instant::now() + WAIT;
    loop {
        let s = boot
            .show("wpd.service", &["ActiveState", "SubState"])
            .await?;
        if s["ActiveState"] == "active" && s["SubState"] == "running" {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "wpd.service not active within {WAIT:?} of answering (no READY=1?): {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let service = boot
        .show(
            "wpd.service",
            &[
                "Type",
                "NotifyAccess",
                "ActiveState",
                "SubState",
                "TriggeredBy",
                "WatchdogUSec",
                "MainPID",
                "NRestarts",
            ],
        )
        .await?;
    ensure!(
        service["Type"] == "notify"
            && service["NotifyAccess"] == "main"
            && service["ActiveState"] == "active"
            && service["SubState"] == "running"
            && service["TriggeredBy"] == "wpd.socket"
            && service["WatchdogUSec"] == "30s",
        "wpd.service after the first connection: {service:?}"
    );
    wait_journal(
        boot,
        &["(socket from systemd)"],
        "wpd did not say it serves the socket systemd passed",
    )
    .await?;
    // The group's members connect; others are refused by the socket's mode.
    let as_user = |user: &'static str| {
        [
            "setpriv",
            "--reuid",
            user,
            "--regid",
            user,
            "--init-groups",
            "wpctl",
            "health",
        ]
    };
    let alice = boot.run(&as_user("alice")).await?;
    ensure!(
        alice.code == Some(0) && alice.stdout.trim() == "serving at unix:/run/wpd/wpd.sock",
        "alice (group wpd) could not connect: {alice:?}"
    );
    let bob = boot.run(&as_user("bob")).await?;
    ensure!(
        bob.code == Some(3) && bob.stderr.contains("Permission denied"),
        "bob (not in group wpd) was not refused by the socket: {bob:?}"
    );

    // What the hardened unit leaves the daemon: exactly its capability set, no new
    // privileges, a system-call filter.
    let main_pid: i64 = service["MainPID"].parse()?;
    let status = boot.proc_file(main_pid, "status")?;
    let unit_caps = unit_capabilities()?;
    let want = cap_mask(unit_caps.iter().map(String::as_str))?;
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let have = status_caps(&status, set)?;
        ensure!(
            have == want,
            "{set} of wpd is {:?}, the unit grants {:?}",
            cap_names(have),
            cap_names(want)
        );
    }
    ensure!(
        status_caps(&status, "CapAmb")? == 0
            && status_field(&status, "NoNewPrivs")? == "1"
            && status_field(&status, "Seccomp")? == "2",
        "wpd runs without NoNewPrivileges= or its system-call filter:\n{status}"
    );
    let limits = boot.proc_file(main_pid, "limits")?;
    if let Some(line) = limits.lines().find(|l| l.starts_with("Max open files")) {
        eprintln!("sysboot: wpd under the unit: {line}");
    }

    // Both backends usable under the unit's hardening: perf on its per-thread BPF path,
    // ptrace with signal stops (a BPF program too).
    let caps = boot.wpctl_json(&["caps"]).await?;
    let backend = |name: &str| {
        caps["backends"]
            .as_array()
            .and_then(|bs| bs.iter().find(|b| b["backend"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let (perf, ptrace) = (backend("perf"), backend("ptrace"));
    ensure!(
        perf["usable"] == true
            && perf["default"] == true
            && perf["events"]
                .as_str()
                .is_some_and(|e| e.starts_with("per-thread")),
        "perf under the unit: {perf}"
    );
    ensure!(
        ptrace["usable"] == true && ptrace["stops"] == "signal",
        "ptrace under the unit: {ptrace}"
    );

    // Multi-threaded targets started in the booted system, one watched per backend.
    let mut on_perf = boot.start_target("wpd-target-perf", 3).await?;
    let mut on_ptrace = boot.start_target("wpd-target-ptrace", 3).await?;
    let perf_id = watch_counter(boot, &on_perf, None).await?;
    let ptrace_id = watch_counter(boot, &on_ptrace, Some("ptrace")).await?;
    wait_for_hits(boot, perf_id, &on_perf, "perf", 0).await?;
    wait_for_hits(boot, ptrace_id, &on_ptrace, "ptrace", 0).await?;

    // The state directory: the journal and the saved watchpoints, nothing others can read.
    check_private(boot, "/var/lib/wpd", &["watchpoints.pb", "journal"]).await?;

    // From here on a short watchdog: the unit's 30 s would make the SIGSTOP check below wait
    // half a minute. A drop-in, as an administrator would add one; the restart after
    // SIGKILL starts the daemon under it.
    boot.sh(&format!(
        "mkdir -p /etc/systemd/system/wpd.service.d\n\
         printf '[Service]\\nWatchdogSec={SHORT_WATCHDOG}\\n' > /etc/systemd/system/wpd.service.d/watchdog.conf\n\
         systemctl daemon-reload"
    ))
    .await?;

    // SIGKILL: systemd restarts it (Restart=on-failure), which sets both watchpoints again.
    let old = service["MainPID"].clone();
    boot.ok(&["systemctl", "kill", "-s", "KILL", "wpd.service"])
        .await?;
    let after_kill = wait_restarted(boot, &old).await?;
    check_set_again(
        boot,
        &mut [
            (&mut on_perf, perf_id, "perf"),
            (&mut on_ptrace, ptrace_id, "ptrace"),
        ],
    )
    .await?;
    let watchdog = boot
        .show(
            "wpd.service",
            &["WatchdogUSec", "WatchdogTimestampMonotonic"],
        )
        .await?;
    ensure!(
        watchdog["WatchdogUSec"] == SHORT_WATCHDOG,
        "the drop-in's watchdog is not in force: {watchdog:?}"
    );
    // The restarted daemon pings: systemd's time of the last ping moves on.
    let deadline = Instant::now() + WAIT;
    loop {
        let now = boot
            .show("wpd.service", &["WatchdogTimestampMonotonic"])
            .await?;
        if now["WatchdogTimestampMonotonic"] != watchdog["WatchdogTimestampMonotonic"] {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no watchdog ping from wpd within {WAIT:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // SIGSTOP: the pings stop, the watchdog kills the daemon (SIGABRT) and it is restarted.
    let stopped = after_kill["MainPID"].clone();
    boot.ok(&[
        "systemctl",
        "kill",
        "--kill-who=main",
        "-s",
        "SIGSTOP",
        "wpd.service",
    ])
    .await?;
    let after_watchdog = wait_restarted(boot, &stopped).await?;
    wait_journal(
        boot,
        &[
            &format!("Watchdog timeout (limit {SHORT_WATCHDOG})"),
            "Failed with result 'watchdog'",
        ],
        "the daemon was restarted, but not by the watchdog",
    )
    .await?;
    let restarts: u32 = after_watchdog["NRestarts"].parse()?;
    ensure!(
        restarts == 2,
        "expected 2 restarts (SIGKILL, watchdog): {after_watchdog:?}"
    );
    check_set_again(
        boot,
        &mut [
            (&mut on_perf, perf_id, "perf"),
            (&mut on_ptrace, ptrace_id, "ptrace"),
        ],
    )
    .await?;

    // systemctl stop: SIGTERM, every target detached, exit status 0; the targets run on,
    // untraced; the socket stays systemd's; the saved watchpoints stay for the next start.
    boot.ok(&["systemctl", "stop", "wpd.service"]).await?;
    let stopped = boot
        .show(
            "wpd.service",
            &["ActiveState", "Result", "ExecMainCode", "ExecMainStatus"],
        )
        .await?;
    ensure!(
        stopped["ActiveState"] == "inactive"
            && stopped["Result"] == "success"
            && stopped["ExecMainCode"] == "1"
            && stopped["ExecMainStatus"] == "0",
        "systemctl stop: {stopped:?}"
    );
    wait_journal(
        boot,
        &["every target was detached"],
        "wpd did not say it detached everything",
    )
    .await?;
    check_alive_untraced(boot, &mut on_perf).await?;
    check_alive_untraced(boot, &mut on_ptrace).await?;
    let socket = boot.show("wpd.socket", &["ActiveState"]).await?;
    ensure!(
        socket["ActiveState"] == "active",
        "wpd.socket after stopping the service: {socket:?}"
    );
    check_private(boot, "/var/lib/wpd", &["watchpoints.pb", "journal"]).await?;
    on_perf.quit().await?;
    on_ptrace.quit().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The DaemonSet
// ---------------------------------------------------------------------------------------

/// `deploy/kubernetes/daemonset.yaml` as JSON (PyYAML).
fn daemonset() -> Result<Value> {
    let path = deploy_dir().join("kubernetes/daemonset.yaml");
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .context("running python3")?;
    require_peer(
        out.status.success(),
        "python3 with PyYAML",
        "PyPI: kubernetes-validate, which brings PyYAML",
    );
    serde_json::from_slice(&out.stdout).context("parsing the DaemonSet as JSON")
}

/// Strings of a JSON array.
fn strings(v: &Value) -> Result<Vec<String>> {
    v.as_array()
        .ok_or_else(|| anyhow!("not a list: {v}"))?
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("not a string: {s}"))
        })
        .collect()
}

/// What the test takes from the DaemonSet's `wpd` container.
struct Container {
    /// `command` then `args`.
    argv: Vec<String>,
    /// `env`.
    env: Vec<(String, String)>,
    /// `securityContext.capabilities.add`.
    caps: Vec<String>,
    /// `(hostPath, mountPath, readOnly)` of every volume mount.
    mounts: Vec<(String, String, bool)>,
    /// The probes' commands, each once.
    probes: Vec<Vec<String>>,
}

fn container() -> Result<Container> {
    let ds = daemonset()?;
    let pod = &ds["spec"]["template"]["spec"];
    ensure!(pod["hostPID"] == true, "the DaemonSet is not hostPID");
    let c = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "wpd"))
        .ok_or_else(|| anyhow!("no container named wpd"))?;
    let sc = &c["securityContext"];
    // What the container is run with below: uid 0, no privilege, no_new_privs, a read-only
    // root, every capability dropped but the added ones.
    ensure!(
        sc["runAsUser"] == 0
            && sc["runAsGroup"] == 0
            && sc["privileged"] == false
            && sc["allowPrivilegeEscalation"] == false
            && sc["readOnlyRootFilesystem"] == true
            && strings(&sc["capabilities"]["drop"])? == ["ALL"],
        "the container's securityContext changed: update this test: {sc}"
    );
    let mut argv = strings(&c["command"])?;
    argv.extend(strings(&c["args"])?);
    let env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            Ok((
                e["name"]
                    .as_str()
                    .ok_or_else(|| anyhow!("env {e}"))?
                    .to_string(),
                e["value"]
                    .as_str()
                    .ok_or_else(|| anyhow!("env {e}"))?
                    .to_string(),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let volumes = pod["volumes"]
        .as_array()
        .ok_or_else(|| anyhow!("no volumes"))?;
    let mounts = c["volumeMounts"]
        .as_array()
        .ok_or_else(|| anyhow!("no volumeMounts"))?
        .iter()
        .map(|m| {
            let v = volumes
                .iter()
                .find(|v| v["name"] == m["name"])
                .ok_or_else(|| anyhow!("no volume for {m}"))?;
            let host = v["hostPath"]["path"]
                .as_str()
                .ok_or_else(|| anyhow!("volume {v} is not a hostPath"))?;
            ensure!(
                v["hostPath"]["type"] == "DirectoryOrCreate",
                "volume {v}: only DirectoryOrCreate is played here"
            );
            Ok((
                host.to_string(),
                m["mountPath"]
                    .as_str()
                    .ok_or_else(|| anyhow!("mount {m}"))?
                    .to_string(),
                m["readOnly"] == true,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut probes = Vec::new();
    for probe in ["livenessProbe", "readinessProbe"] {
        let cmd = strings(&c[probe]["exec"]["command"])?;
        if !probes.contains(&cmd) {
            probes.push(cmd);
        }
    }
    Ok(Container {
        argv,
        env,
        caps: strings(&sc["capabilities"]["add"])?,
        mounts,
        probes,
    })
}

impl Container {
    /// `setpriv` as the runtime sets the container's process up: uid and gid 0 without
    /// supplementary groups, the bounding set the added capabilities (root's permitted and
    /// effective sets follow it at exec), no inheritable or ambient capabilities,
    /// no_new_privs; then `env -i` with the image's PATH and the container's `env`.
    fn exec_prefix(&self) -> Vec<String> {
        let bounding: Vec<String> = self
            .caps
            .iter()
            .map(|c| format!("+{}", c.to_ascii_lowercase()))
            .collect();
        let mut v: Vec<String> = [
            "setpriv",
            "--reuid=0",
            "--regid=0",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--ambient-caps=-all",
        ]
        .map(str::to_string)
        .into();
        v.push(format!("--bounding-set=-all,{}", bounding.join(",")));
        v.extend([
            "env".to_string(),
            "-i".to_string(),
            format!("PATH={PATH_INSIDE}"),
        ]);
        v.extend(self.env.iter().map(|(k, val)| format!("{k}={val}")));
        v
    }

    /// The script run in the container's new namespaces (in the node): the image's root
    /// (the node's root filesystem alone, without the node's mounts), its `proc` (the node's
    /// pid namespace: hostPID), a read-only `sysfs`, a small `/dev`, the hostPath volumes,
    /// `pivot_root` into it, the root read-only, then the command line.
    fn script(&self) -> String {
        let mut s = String::from(
            "set -eu\n\
             c=/run/wpd-pod-root\n\
             mkdir -p $c\n\
             mount --bind / $c\n\
             mount -t proc proc $c/proc\n\
             mount -t sysfs -o ro sysfs $c/sys\n\
             mount -t tmpfs -o mode=755,nosuid tmpfs $c/dev\n\
             for n in null zero full random urandom tty; do touch $c/dev/$n; mount --bind /dev/$n $c/dev/$n; done\n\
             mkdir $c/dev/pts $c/dev/shm\n\
             mount -t devpts -o newinstance,ptmxmode=0666 devpts $c/dev/pts\n\
             ln -s pts/ptmx $c/dev/ptmx\n\
             mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $c/dev/shm\n",
        );
        for (host, path, read_only) in &self.mounts {
            let to = quote(&format!("/run/wpd-pod-root{path}"));
            s.push_str(&format!(
                "mkdir -p {to}\nmount --bind {} {to}\n",
                quote(host)
            ));
            if *read_only {
                s.push_str(&format!("mount -o remount,bind,ro {to}\n"));
            }
        }
        s.push_str(
            "cd $c\n\
             pivot_root . mnt\n\
             cd /\n\
             umount -l /mnt\n\
             mount -o remount,bind,ro /\n",
        );
        let argv: Vec<String> = self
            .exec_prefix()
            .iter()
            .chain(&self.argv)
            .map(|a| quote(a))
            .collect();
        s.push_str(&format!("exec {}\n", argv.join(" ")));
        s
    }
}

/// The DaemonSet's container, started in the booted node: `nsenter` (our child) runs the
/// container's namespaces and script; the daemon is its child. Dropping it kills the daemon.
struct Pod {
    nsenter: Child,
    /// The daemon's pid here.
    daemon: i32,
    exited: bool,
    log: PathBuf,
}

impl Pod {
    /// Starts the container; its output goes to `name`.log in the boot's directory.
    async fn start(boot: &Boot, container: &Container, name: &str) -> Result<Pod> {
        let log = boot.dir.join(format!("{name}.log"));
        let out = fs::File::create(&log)?;
        let mut cmd = Command::new("nsenter");
        cmd.args(boot.nsenter_args())
            .args([
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--net",
                "--uts",
                "--ipc",
                "--",
                "sh",
                "-c",
                &container.script(),
            ])
            .env_clear()
            .env("PATH", PATH_INSIDE)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        die_with_parent(&mut cmd);
        let nsenter = cmd.spawn().context("starting the container")?;
        let mut pod = Pod {
            nsenter,
            daemon: 0,
            exited: false,
            log,
        };
        let deadline = Instant::now() + WAIT;
        let want = container.argv.first().cloned().unwrap_or_default();
        loop {
            if let Some(st) = pod.nsenter.try_wait()? {
                pod.exited = true;
                bail!("the container ended ({st}):\n{}", pod.log());
            }
            if let Some(pid) = first_child(pod.nsenter.id()) {
                let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                if exe.to_string_lossy().ends_with(&want) {
                    pod.daemon = pid;
                    return Ok(pod);
                }
            }
            ensure!(
                Instant::now() < deadline,
                "the container did not exec {want} within {WAIT:?}:\n{}",
                pod.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs the probes' commands in the container until each says the daemon serves.
    async fn wait_probes(&self, container: &Container) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        for probe in &container.probes {
            loop {
                let out = self.exec(container, probe).await?;
                if out.code == Some(0) && out.stdout.starts_with("serving at ") {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "the probe {probe:?} did not pass within {WAIT:?}: {out:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// SIGKILL to the daemon; waits until it is gone.
    fn kill_and_wait(&mut self) -> Result<()> {
        // SAFETY: kill has no memory-safety preconditions; the daemon is the child of our
        // unreaped child `nsenter`, which waits for it.
        unsafe { libc::kill(self.daemon, libc::SIGKILL) };
        let st = self.nsenter.wait()?;
        self.exited = true;
        ensure!(
            st.signal() == Some(libc::SIGKILL),
            "the container's wpd ended with {st}, not SIGKILL"
        );
        Ok(())
    }

    /// Runs `args` in the container's namespaces (its root, network, the node's pid
    /// namespace) with the container's credentials, as the kubelet runs an exec probe.
    async fn exec(&self, container: &Container, args: &[String]) -> Result<CmdOutput> {
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.args([
            "--target",
            &self.daemon.to_string(),
            "--pid",
            "--mount",
            "--net",
            "--uts",
            "--ipc",
            "--root",
            "--wd",
            "--",
        ])
        .args(container.exec_prefix())
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
            .await
            .map_err(|_| anyhow!("{args:?} in the container did not finish"))??;
        Ok(CmdOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if !self.exited {
            if self.daemon > 0 {
                // SAFETY: kill has no memory-safety preconditions; the daemon is the child of
                // our unreaped child `nsenter`, which waits for it.
                unsafe { libc::kill(self.daemon, libc::SIGKILL) };
            }
            let _ = self.nsenter.kill();
            let _ = self.nsenter.wait();
        }
        if std::thread::panicking() {
            eprintln!("----- the container's output -----\n{}\n-----", self.log());
        }
    }
}

/// The DaemonSet's container (command line, environment, capabilities, read-only root,
/// hostPath volumes) run in the pid namespace of a booted node, watching targets of the node:
/// see the module's documentation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonset_container_in_the_nodes_pid_namespace() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    if own_cgroup2().is_none() {
        machine_skip("no cgroup2 hierarchy mounted here: systemd needs one to boot");
        return Ok(());
    }
    let container = container()?;
    let rootfs = tokio::task::block_in_place(root_filesystem)?;
    // The image: /usr/local/bin/wpd and wpctl (the probes run it).
    let boot = Boot::start(&rootfs, |upper| {
        for bin in ["wpd", "wpctl"] {
            put_file(
                &bin_path(bin),
                &upper.join("usr/local/bin").join(bin),
                0o755,
            )?;
        }
        put_file(
            &bin_path("wpd-target"),
            &upper.join(TARGET_INSIDE.trim_start_matches('/')),
            0o755,
        )
    })
    .await?;
    let result = daemonset_checks(&boot, &container).await;
    boot.finish(result)
}

async fn daemonset_checks(boot: &Boot, container: &Container) -> Result<()> {
    // DirectoryOrCreate, as the kubelet makes them: 0755, root's.
    for (host, _, _) in &container.mounts {
        boot.ok(&["mkdir", "-p", "-m", "0755", host]).await?;
    }
    let mut on_perf = boot.start_target("wpd-target-perf", 3).await?;
    let mut on_ptrace = boot.start_target("wpd-target-ptrace", 3).await?;
    let mut pod = Pod::start(boot, container, "pod").await?;
    let result = async {
        pod.wait_probes(container).await?;

        // The daemon's credentials: uid 0, the added capabilities and no others, nothing
        // inheritable or ambient, no_new_privs, a read-only root.
        let status = fs::read_to_string(format!("/proc/{}/status", pod.daemon))?;
        let own = fs::read_to_string("/proc/self/status")?;
        let added = cap_mask(container.caps.iter().map(String::as_str))?;
        let grantable = status_caps(&own, "CapBnd")?;
        let want = added & grantable;
        if want != added {
            eprintln!(
                "sysboot: this machine's bounding set lacks {:?}, which the DaemonSet adds: the \
                 daemon runs without it here",
                cap_names(added & !grantable)
            );
        }
        for set in ["CapEff", "CapPrm", "CapBnd"] {
            let have = status_caps(&status, set)?;
            ensure!(
                have == want,
                "{set} of the container's wpd is {:?}, expected {:?}",
                cap_names(have),
                cap_names(want)
            );
        }
        ensure!(
            status_caps(&status, "CapInh")? == 0
                && status_caps(&status, "CapAmb")? == 0
                && status_field(&status, "NoNewPrivs")? == "1"
                && status_field(&status, "Uid")?
                    .split_whitespace()
                    .all(|u| u == "0"),
            "the container's wpd:\n{status}"
        );
        let limits = fs::read_to_string(format!("/proc/{}/limits", pod.daemon))?;
        if let Some(line) = limits.lines().find(|l| l.starts_with("Max open files")) {
            eprintln!("sysboot: the container's wpd: {line}");
        }
        let mountinfo = fs::read_to_string(format!("/proc/{}/mountinfo", pod.daemon))?;
        let root = mountinfo
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/"))
            .ok_or_else(|| anyhow!("no / in the daemon's mountinfo:\n{mountinfo}"))?;
        ensure!(
            root.split_whitespace()
                .nth(5)
                .is_some_and(|o| o.split(',').any(|x| x == "ro")),
            "the container's root is not read-only: {root}"
        );
        // In the node's pid namespace (hostPID): its pid there is what the node sees.
        let ns_pid = status_field(&status, "NSpid")?;
        ensure!(
            ns_pid.split_whitespace().count() == 2,
            "the daemon is not in the node's pid namespace: NSpid {ns_pid}"
        );

        // Clients on the node, through the hostPath socket: both backends, on the node's
        // processes named by the node's pids.
        let caps = boot.wpctl_json(&["caps"]).await?;
        ensure!(
            caps["backends"]
                .as_array()
                .is_some_and(|bs| bs.iter().any(|b| b["backend"] == "perf"
                    && b["usable"] == true
                    && b["events"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("per-thread")))
                    && bs
                        .iter()
                        .any(|b| b["backend"] == "ptrace" && b["usable"] == true)),
            "the container's backends: {caps}"
        );
        let perf_id = watch_counter(boot, &on_perf, None).await?;
        let ptrace_id = watch_counter(boot, &on_ptrace, Some("ptrace")).await?;
        wait_for_hits(boot, perf_id, &on_perf, "perf", 0).await?;
        wait_for_hits(boot, ptrace_id, &on_ptrace, "ptrace", 0).await?;
        // The state, in the hostPath: private (the daemon narrows the kubelet's 0755).
        check_private(boot, "/var/lib/wpd", &["watchpoints.pb", "journal"]).await?;

        // The container killed (SIGKILL) and started again, as the kubelet does after a
        // failed liveness probe: the same hostPaths, both watchpoints set again, the targets
        // alive.
        pod.kill_and_wait()?;
        pod = Pod::start(boot, container, "pod-restarted").await?;
        pod.wait_probes(container).await?;
        check_set_again(
            boot,
            &mut [
                (&mut on_perf, perf_id, "perf"),
                (&mut on_ptrace, ptrace_id, "ptrace"),
            ],
        )
        .await?;

        // Termination: SIGTERM, everything detached, exit status 0.
        // SAFETY: kill has no memory-safety preconditions; see `Pod`'s drop.
        unsafe { libc::kill(pod.daemon, libc::SIGTERM) };
        let deadline = Instant::now() + WAIT;
        let st = loop {
            if let Some(st) = pod.nsenter.try_wait()? {
                pod.exited = true;
                break st;
            }
            ensure!(
                Instant::now() < deadline,
                "the container's wpd did not exit within {WAIT:?} of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        ensure!(
            st.success(),
            "the container's wpd exited with {st}:\n{}",
            pod.log()
        );
        ensure!(
            pod.log().contains("every target was detached"),
            "the container's wpd did not say it detached everything:\n{}",
            pod.log()
        );
        check_alive_untraced(boot, &mut on_perf).await?;
        check_alive_untraced(boot, &mut on_ptrace).await?;
        on_perf.quit().await?;
        on_ptrace.quit().await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("----- the container's output -----\n{}\n-----", pod.log());
    }
    drop(pod);
    result
}
