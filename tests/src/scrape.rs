//! The daemon's Prometheus endpoint (`wpd --metrics-listen 127.0.0.1:0`) as the tests read it:
//! its address from the daemon's log, a page fetched over HTTP/1.0, one sample's value.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The address the daemon logged for its metrics (`wpd: metrics on http://ADDR/metrics`).
pub fn metrics_address(log: &str) -> Result<std::net::SocketAddr> {
    log.lines()
        .find_map(|l| l.strip_prefix("wpd: metrics on http://"))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .ok_or_else(|| anyhow!("the daemon did not log its metrics address:\n{log}"))?
        .parse()
        .context("parsing the metrics address")
}

/// The body of `GET path` from `addr` (HTTP/1.0: the server closes after the answer), which must
/// answer 200.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<String> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| anyhow!("GET http://{addr}{path} timed out"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("GET http://{addr}{path}: no header end in {answer:?}"))?;
    ensure!(
        head.lines()
            .next()
            .is_some_and(|l| l.split(' ').nth(1) == Some("200")),
        "GET http://{addr}{path}: {head}"
    );
    Ok(body.to_string())
}

/// The value of the sample `name{labels}` (labels as the exposition writes them, `""` for
/// none) in a Prometheus text page.
pub fn metric_value(page: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(key.as_str())?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
