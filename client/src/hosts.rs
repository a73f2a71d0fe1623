//! The daemons a command talks to: `--endpoint`s (given on either side of
//! the subcommand) and the lines of `--endpoints-file`, each with its own
//! `Ctx`, token and CA, and the rule of which token goes to which daemon.

use crate::cmd::Ctx;
use crate::endpoints::{self, Endpoint};
use crate::error::Error;
use crate::{Cli, credentials};

/// One daemon of the fleet.
#[derive(Debug)]
pub struct Host {
    /// What its output is tagged with: the name from the endpoints file, or
    /// the endpoint's `HOST:PORT` (a socket endpoint: as given).
    pub label: String,
    /// How to reach it.
    pub ctx: Ctx,
}

/// The tag of a host with no name: `HOST:PORT` for TCP endpoints (with or
/// without TLS), the endpoint as given for a socket.
pub fn default_label(endpoint: &Endpoint) -> String {
    use wpd_proto::connect::Target;
    match &endpoint.target {
        Target::Tcp(uri) => uri.strip_prefix("http://").unwrap_or(uri).to_string(),
        Target::Tls(uri) => uri.strip_prefix("https://").unwrap_or(uri).to_string(),
        Target::Unix(_) => endpoint.text.clone(),
    }
}

/// Every `--endpoint` of a command line that clap accepted, in order. clap
/// keeps only those after the subcommand when a global option is given on
/// both sides of it (`wpctl --endpoint A list --endpoint B`); the command line
/// has them all. Stops at `--`.
pub fn endpoints_in(args: &[String]) -> Vec<Endpoint> {
    let mut found = Vec::new();
    let mut words = args.iter().skip(1);
    while let Some(w) = words.next() {
        let value = match w.as_str() {
            "--" => break,
            "--endpoint" => words.next().map(String::as_str),
            _ => w.strip_prefix("--endpoint="),
        };
        found.extend(value.and_then(|v| v.parse().ok()));
    }
    found
}

/// The daemons to talk to: the `--endpoint`s given on the command line and
/// the lines of `--endpoints-file`; without either, `WPD_ENDPOINT` or the
/// default socket. `given`: `--endpoint` was on the command line;
/// `token_given`: so was `--token-file`. Token and CA files are read here,
/// once each.
///
/// Tokens: `--token-file` (or `WPD_TOKEN_FILE`) goes only to the
/// `--endpoint`s (or `WPD_ENDPOINT`, or the default socket); a line of the
/// endpoints file gets only its own `token-file=`, so that a token meant for
/// one daemon never reaches another. `--token-file` with an endpoints file
/// and no `--endpoint` would go nowhere and is refused. `--tls-ca` (not a
/// secret) serves every endpoint without its own. No token goes over
/// plaintext TCP to an address that is not loopback.
pub fn hosts(cli: &Cli, given: bool, token_given: bool) -> Result<Vec<Host>, Error> {
    if cli.endpoints_file.is_some() && !given && token_given {
        return Err(Error::Local(
            "--token-file is sent only to the daemons named by --endpoint, and none is given: \
             name each daemon's token on its line of the endpoints file (`NAME ENDPOINT \
             token-file=FILE`)"
                .into(),
        ));
    }
    let mut files = credentials::Files::default();
    let global_token = cli.token_file.as_deref();
    let global_ca = cli.tls_ca.as_deref();
    let mut hosts = Vec::new();
    let mut add = |name: Option<String>,
                   endpoint: Endpoint,
                   token_file: Option<&std::path::Path>,
                   tls_ca: Option<&std::path::Path>|
     -> Result<(), Error> {
        let label = name.unwrap_or_else(|| default_label(&endpoint));
        if hosts.iter().any(|h: &Host| h.label == label) {
            return Err(Error::Local(format!(
                "two endpoints would both be tagged [{label}]: give each a name in an \
                 --endpoints-file, or list each endpoint once"
            )));
        }
        let local = |e: credentials::FileError| Error::Local(e.to_string());
        let token = token_file
            .map(|p| files.token(p))
            .transpose()
            .map_err(local)?;
        if token.is_some()
            && let Some(refusal) = credentials::plaintext_refusal(&endpoint.text, &endpoint.target)
        {
            return Err(Error::Local(refusal));
        }
        let ctx = Ctx {
            endpoint,
            json: cli.json,
            timeout: cli.timeout,
            token,
            connect: wpd_proto::connect::Options {
                tls_ca_pem: tls_ca.map(|p| files.ca(p)).transpose().map_err(local)?,
            },
        };
        hosts.push(Host { label, ctx });
        Ok(())
    };
    if cli.endpoints_file.is_none() || given {
        for endpoint in &cli.endpoints {
            add(None, endpoint.clone(), global_token, global_ca)?;
        }
    }
    if let Some(path) = &cli.endpoints_file {
        let entries = endpoints::load(path).map_err(|e| Error::Local(e.to_string()))?;
        for e in entries {
            add(
                e.name,
                e.endpoint,
                e.token_file.as_deref(),
                e.tls_ca.as_deref().or(global_ca),
            )?;
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::connect::Target;

    #[test]
    fn endpoints() {
        fn check(input: &str, expected: Result<Target, &str>) {
            let got = input.parse::<Endpoint>();
            match expected {
                Ok(t) => {
                    let e = got.unwrap_or_else(|m| panic!("{input:?}: {m}"));
                    assert_eq!(e.target, t, "{input:?}");
                    assert_eq!(e.to_string(), input.trim());
                }
                Err(part) => {
                    let msg = got.expect_err(input);
                    assert!(msg.contains(part), "{input:?}: {msg}");
                }
            }
        }
        check(
            "unix:/run/wpd/wpd.sock",
            Ok(Target::Unix("/run/wpd/wpd.sock".into())),
        );
        check("unix:///tmp/w.sock", Ok(Target::Unix("/tmp/w.sock".into())));
        check("/tmp/w.sock", Ok(Target::Unix("/tmp/w.sock".into())));
        check("https://h:9", Ok(Target::Tls("https://h:9".into())));
        check(
            "tcp://127.0.0.1:7000",
            Ok(Target::Tcp("http://127.0.0.1:7000".into())),
        );
        check("tcp://localhost", Err("HOST:PORT"));
        check("unix:", Err("empty"));
        check("wpd.sock", Err("neither"));

        let d = Endpoint::default();
        assert_eq!(d.text, format!("unix:{}", wpd_proto::DEFAULT_SOCKET));
        assert_eq!(d.target, Target::Unix(wpd_proto::DEFAULT_SOCKET.into()));
    }

    #[test]
    fn endpoints_on_both_sides_of_the_subcommand() {
        let args = |a: &[&str]| -> Vec<String> {
            std::iter::once("wpctl")
                .chain(a.iter().copied())
                .map(String::from)
                .collect()
        };
        let texts = |a: &[&str]| -> Vec<String> {
            endpoints_in(&args(a)).into_iter().map(|e| e.text).collect()
        };
        assert_eq!(
            texts(&["--endpoint", "tcp://a:1", "list", "--endpoint=https://b:2"]),
            ["tcp://a:1", "https://b:2"]
        );
        assert_eq!(
            texts(&["--json", "stats", "--endpoint", "unix:/x.sock"]),
            ["unix:/x.sock"]
        );
        assert_eq!(
            texts(&["--endpoint", "tcp://a:1", "--", "--endpoint", "tcp://c:3"]),
            ["tcp://a:1"]
        );
        assert!(texts(&["caps"]).is_empty());
    }
}
