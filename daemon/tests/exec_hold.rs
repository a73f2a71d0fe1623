//! `backend::exechold` against the real kernel: a program whose first
//! instruction stores 2 into a global initialised to 1 (static, no C
//! library, built here with `cc`) is held at its exec, before that
//! instruction: at the callback the global still reads 1 through
//! `/proc/PID/mem` and `/proc/PID/exe` is the program. Its parent, waiting
//! with `WUNTRACED | WCONTINUED`, is told of its exit status alone. A copy
//! of the program at another path (another inode) is not held; a callback
//! slower than the bound does not keep the program from running on.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object::{Object, ObjectSymbol};
use wpd::backend::exechold::ExecHold;

/// The program: `first = 2`, then `exit(7)`, from its first instruction.
const SOURCE: &str = "volatile int first = 1;\n\
    void _start(void)\n{\n    first = 2;\n\
    __asm__ volatile(\"mov $60, %eax\\n mov $7, %edi\\n syscall\");\n}\n";

/// Builds the program in a directory of its own: its path and the address
/// of `first`.
fn build(dir: &Path) -> (PathBuf, u64) {
    let src = dir.join("first.c");
    let exe = dir.join("first");
    std::fs::write(&src, SOURCE).unwrap();
    let st = std::process::Command::new("cc")
        .args(["-O1", "-static", "-nostdlib", "-fno-pie", "-no-pie", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed");
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let first = file
        .symbols()
        .find(|s| s.name() == Ok("first"))
        .expect("the symbol `first`")
        .address();
    (exe, first)
}

/// In a process of its own (not this one: the hold's thread, a tracer,
/// would collect its tracee's stops for this process), forks and execs
/// `exe` and waits for it as a shell does (stops and continues
/// reported): every status that parent was told of, and how long it took.
fn run_as_parent(exe: &Path) -> (Vec<i32>, Duration) {
    run_as_parent_lingering(exe, 0)
}

/// [`run_as_parent`], the child living `linger_us` more when its execve
/// fails.
fn run_as_parent_lingering(exe: &Path, linger_us: u32) -> (Vec<i32>, Duration) {
    let path = std::ffi::CString::new(exe.as_os_str().as_bytes()).unwrap();
    let argv = [path.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    let mut pipe = [0; 2];
    // SAFETY: a valid array of two fds.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let t0 = Instant::now();
    // SAFETY: the forked processes only call fork, execve, waitpid, write
    // and _exit (async-signal-safe).
    let parent = unsafe { libc::fork() };
    assert!(parent >= 0, "fork");
    if parent == 0 {
        unsafe {
            libc::close(pipe[0]);
            let pid = libc::fork();
            if pid == 0 {
                libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
                if linger_us > 0 {
                    libc::usleep(linger_us);
                }
                libc::_exit(127);
            }
            loop {
                let mut status = 0;
                if libc::waitpid(pid, &mut status, libc::WUNTRACED | libc::WCONTINUED) != pid {
                    libc::_exit(1);
                }
                libc::write(pipe[1], (&raw const status).cast(), 4);
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    libc::_exit(0);
                }
            }
        }
    }
    // SAFETY: our end of the pipe.
    unsafe { libc::close(pipe[1]) };
    let mut all = Vec::new();
    let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
    std::io::Read::read_to_end(&mut f, &mut all).unwrap();
    let took = t0.elapsed();
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(parent, &mut status, 0) };
    let seen = all
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    (seen, took)
}

/// What the callback saw at a task's exec stop.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    pid: i32,
    first: Option<u32>,
    exe: Option<PathBuf>,
}

fn read_u32(pid: i32, at: u64) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, at).ok()?;
    Some(u32::from_ne_bytes(b))
}

#[test]
fn a_program_is_held_at_exec_before_its_first_instruction_and_its_parent_sees_nothing() {
    if !wpd_test_skip::require_root("fanotify permission events and ptrace") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("wpd-exec-hold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (exe, first) = build(&dir);
    let other = dir.join("first-copy");
    std::fs::copy(&exe, &other).unwrap();

    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let slow = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let at_exec = {
        let (seen, slow) = (seen.clone(), slow.clone());
        move |pid: i32| {
            seen.lock().unwrap().push(Seen {
                pid,
                first: read_u32(pid, first),
                exe: std::fs::read_link(format!("/proc/{pid}/exe")).ok(),
            });
            if slow.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(3));
            }
        }
    };
    let hold = ExecHold::start(Duration::from_millis(200), Arc::new(at_exec)).expect("fanotify");
    hold.mark(&exe).expect("mark");

    // Held: before its first instruction, its parent told of the exit only.
    for _ in 0..5 {
        let (statuses, _) = run_as_parent(&exe);
        assert_eq!(
            statuses.len(),
            1,
            "the parent was told of more: {statuses:?}"
        );
        assert!(libc::WIFEXITED(statuses[0]) && libc::WEXITSTATUS(statuses[0]) == 7);
    }
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 5, "each exec held once: {got:?}");
    for s in &got {
        assert_eq!(
            s.first,
            Some(1),
            "its first instruction ran before the hold: {s:?}"
        );
        assert_eq!(s.exe.as_deref(), Some(exe.as_path()), "{s:?}");
    }
    assert_eq!(hold.counts().held.load(Ordering::Relaxed), 5);

    // Another inode, the same bytes: not held.
    let (statuses, _) = run_as_parent(&other);
    assert_eq!(statuses.len(), 1);
    assert!(libc::WIFEXITED(statuses[0]) && libc::WEXITSTATUS(statuses[0]) == 7);
    assert_eq!(seen.lock().unwrap().len(), 5, "a file not marked was held");

    // A callback past the bound: the program runs on at the bound.
    slow.store(true, Ordering::Relaxed);
    let (statuses, took) = run_as_parent(&exe);
    assert!(libc::WIFEXITED(statuses[0]) && libc::WEXITSTATUS(statuses[0]) == 7);
    assert!(
        took < Duration::from_secs(3),
        "held past the bound: {took:?}"
    );
    assert_eq!(hold.counts().past_bound.load(Ordering::Relaxed), 1);

    // An exec that fails after its open (a file marked executable that no
    // loader takes), the process living on (2 s): no exec stop comes, the
    // hold's timer stops the task at its bound (1 s) and lets it go, the
    // stop signal discarded: its parent is told of the exit after the
    // failed execve (127) and of nothing else (no stop).
    let junk = dir.join("not-a-program");
    std::fs::write(&junk, b"\x7fELF no program at all").unwrap();
    std::fs::set_permissions(&junk, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    hold.mark(&junk).expect("mark");
    slow.store(false, Ordering::Relaxed);
    let run = {
        let junk = junk.clone();
        std::thread::spawn(move || run_as_parent_lingering(&junk, 2_000_000))
    };
    // Let go at its bound, while it still lives.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        hold.counts().no_exec.load(Ordering::Relaxed),
        1,
        "the task whose exec failed was not let go at the bound"
    );
    let (statuses, took) = run.join().unwrap();
    assert_eq!(
        statuses.len(),
        1,
        "the parent was told of more: {statuses:?}"
    );
    assert!(
        libc::WIFEXITED(statuses[0]) && libc::WEXITSTATUS(statuses[0]) == 127,
        "{statuses:?}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "it lived {took:?}"
    );
    assert_eq!(hold.counts().no_exec.load(Ordering::Relaxed), 1);
    assert_eq!(
        seen.lock().unwrap().len(),
        6,
        "a failed exec was given to the callback"
    );

    // Unmarked: not held any more.
    hold.unmark(&exe).expect("unmark");
    slow.store(false, Ordering::Relaxed);
    let (statuses, _) = run_as_parent(&exe);
    assert!(libc::WIFEXITED(statuses[0]) && libc::WEXITSTATUS(statuses[0]) == 7);
    assert_eq!(seen.lock().unwrap().len(), 6, "held after the unmark");
    drop(hold);
    let _ = std::fs::remove_dir_all(&dir);
}
