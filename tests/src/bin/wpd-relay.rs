//! `wpd-relay LISTEN TARGET`: accepts connections on the Unix socket path LISTEN and relays
//! each, both ways, to a new connection to the Unix socket path TARGET. Run in another pid
//! namespace than the test's (`nsenter --pid`), it makes the daemon's peer on every connection
//! a process of that namespace: what a client running there would be.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::ExitCode;

fn pipe(mut from: UnixStream, mut to: UnixStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, target] = args.as_slice() else {
        eprintln!("usage: wpd-relay LISTEN TARGET");
        return ExitCode::from(2);
    };
    let listener = match UnixListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("wpd-relay: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        let server = match UnixStream::connect(target) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("wpd-relay: cannot connect to {target}: {e}");
                continue;
            }
        };
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        std::thread::spawn(move || pipe(client, server));
        std::thread::spawn(move || pipe(s2, c2));
    }
    ExitCode::SUCCESS
}
