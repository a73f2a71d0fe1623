//! `wpd-probe`: what the end-to-end tests run as another user, or as a hostile client, to ask
//! the kernel or the daemon something. One subcommand per question; each prints one line.
//!
//! | command | does | prints |
//! |---|---|---|
//! | `access PID ADDR` | `process_vm_readv` of 1 byte (the kernel's `PTRACE_MODE_ATTACH_REALCREDS` check, the one `PTRACE_SEIZE` makes) | `ALLOWED` or `DENIED <errno>` |
//! | `hold SOCKET N` | opens N connections to the daemon's Unix socket, each sending the HTTP/2 preface and an empty SETTINGS frame; after 1 s counts those the daemon has not closed; keeps them until stdin ends, then prints how many stayed open to the end | `OPEN k`, later `KEPT k` |
//! | `half-open SOCKET CONNS STREAMS` | on CONNS connections, opens STREAMS request streams each (HEADERS of a unary call, never the body: a half-open stream), ignoring the server's stream limit; counts the streams the server refused (RST_STREAM); keeps them until stdin ends | `SENT s REFUSED r`, later `CLOSED` |
//! | `subscribe SOCKET N` | N `StreamEvents` subscriptions on one connection, kept until stdin ends | `SUBSCRIBED k` or `SUBSCRIBED k REFUSED <code> <message>`, later `CLOSED` |
//!
//! The raw HTTP/2 of `hold` and `half-open` is written by hand on purpose: a client that
//! ignores the protocol's limits is what those tests need, and no client library will be one.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One HTTP/2 frame: 9-byte header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const END_HEADERS: u8 = 0x4;

/// HPACK "literal header field without indexing", new name, no Huffman (RFC 7541 §6.2.2).
fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    for s in [name, value] {
        assert!(s.len() < 127, "short strings only");
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }
}

/// The header block of a unary `GetStats` call on the Unix socket.
fn request_headers() -> Vec<u8> {
    let mut h = Vec::new();
    h.push(0x83); // :method POST (static table 3)
    h.push(0x86); // :scheme http (static table 6)
    literal(&mut h, ":path", "/wpd.v1.Watchpoints/GetStats");
    literal(&mut h, ":authority", "localhost");
    literal(&mut h, "content-type", "application/grpc");
    literal(&mut h, "te", "trailers");
    h
}

fn connect(path: &str) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(path)?;
    s.write_all(PREFACE)?;
    s.write_all(&frame(SETTINGS, 0, 0, &[]))?;
    Ok(s)
}

/// True while the peer has not closed `s` (a read would not return EOF or an error).
fn still_open(s: &UnixStream) -> bool {
    let mut buf = [0u8; 4096];
    let _ = s.set_nonblocking(true);
    let open = loop {
        match (&*s).read(&mut buf) {
            Ok(0) => break false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(_) => break false,
        }
    };
    let _ = s.set_nonblocking(false);
    open
}

fn wait_stdin_end() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn hold(path: &str, n: usize) -> ExitCode {
    let conns: Vec<UnixStream> = (0..n).filter_map(|_| connect(path).ok()).collect();
    std::thread::sleep(Duration::from_secs(1));
    let open = conns.iter().filter(|s| still_open(s)).count();
    println!("OPEN {open}");
    let _ = std::io::stdout().flush();
    wait_stdin_end();
    let kept = conns.iter().filter(|s| still_open(s)).count();
    println!("KEPT {kept}");
    ExitCode::SUCCESS
}

fn half_open(path: &str, conns: usize, streams: usize) -> ExitCode {
    let refused = Arc::new(AtomicU64::new(0));
    let block = request_headers();
    let mut sent = 0u64;
    let mut keep = Vec::new();
    for _ in 0..conns {
        let Ok(mut s) = connect(path) else { continue };
        // Read whatever the server sends, counting refused streams, so that it never blocks
        // on a full socket.
        let mut r = s.try_clone().expect("clone socket");
        let refused = refused.clone();
        std::thread::spawn(move || {
            let mut head = [0u8; 9];
            loop {
                if r.read_exact(&mut head).is_err() {
                    return;
                }
                let len = (usize::from(head[0]) << 16)
                    | (usize::from(head[1]) << 8)
                    | usize::from(head[2]);
                let mut body = vec![0u8; len];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                if head[3] == RST_STREAM {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let mut batch = Vec::with_capacity(64 * 1024);
        for i in 0..streams {
            let id = 1 + 2 * i as u32;
            batch.extend(frame(HEADERS, END_HEADERS, id, &block));
            if batch.len() > 60 * 1024 {
                if s.write_all(&batch).is_err() {
                    break;
                }
                batch.clear();
            }
            sent += 1;
        }
        let _ = s.write_all(&batch);
        keep.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    println!("SENT {sent} REFUSED {}", refused.load(Ordering::Relaxed));
    let _ = std::io::stdout().flush();
    wait_stdin_end();
    drop(keep);
    println!("CLOSED");
    ExitCode::SUCCESS
}

fn subscribe(path: &str, n: usize) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let target = wpd_proto::connect::Target::Unix(path.into());
        let mut client = match wpd_proto::connect::client(&target).await {
            Ok(c) => c,
            Err(e) => {
                println!("SUBSCRIBED 0 REFUSED Unavailable {e}");
                return ExitCode::SUCCESS;
            }
        };
        let mut streams = Vec::new();
        for _ in 0..n {
            match client
                .stream_events(wpd_proto::v1::StreamEventsRequest::default())
                .await
            {
                Ok(s) => streams.push(s),
                Err(s) => {
                    println!(
                        "SUBSCRIBED {} REFUSED {:?} {}",
                        streams.len(),
                        s.code(),
                        s.message()
                    );
                    break;
                }
            }
        }
        if streams.len() == n {
            println!("SUBSCRIBED {}", streams.len());
        }
        let _ = std::io::stdout().flush();
        tokio::task::spawn_blocking(wait_stdin_end).await.ok();
        drop(streams);
        println!("CLOSED");
        ExitCode::SUCCESS
    })
}

fn access(pid: &str, addr: &str) -> ExitCode {
    let pid: libc::pid_t = match pid.parse() {
        Ok(p) => p,
        Err(_) => return usage(),
    };
    let addr = match addr.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => addr.parse(),
    };
    let Ok(addr) = addr else { return usage() };
    let mut byte = 0u8;
    let local = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: one writable local byte; the remote range is only read by the kernel.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n == 1 {
        println!("ALLOWED");
    } else {
        let e = std::io::Error::last_os_error();
        let name = match e.raw_os_error() {
            Some(libc::EPERM) => "EPERM".to_string(),
            Some(libc::ESRCH) => "ESRCH".to_string(),
            Some(libc::EFAULT) => "EFAULT".to_string(),
            _ => e.to_string(),
        };
        println!("DENIED {name}");
    }
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: wpd-probe access PID ADDR | hold SOCKET N | half-open SOCKET CONNS STREAMS | \
         subscribe SOCKET N"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = |s: &str| s.parse::<usize>().ok();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["access", pid, addr] => access(pid, addr),
        ["hold", path, count] => match n(count) {
            Some(c) => hold(path, c),
            None => usage(),
        },
        ["half-open", path, conns, streams] => match (n(conns), n(streams)) {
            (Some(c), Some(s)) => half_open(path, c, s),
            _ => usage(),
        },
        ["subscribe", path, count] => match n(count) {
            Some(c) => subscribe(path, c),
            None => usage(),
        },
        _ => usage(),
    }
}
