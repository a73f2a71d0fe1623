//! DAP's base protocol: each message is `Content-Length: N\r\n\r\n` and N
//! bytes of UTF-8 JSON. Other header fields are allowed and ignored.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most bytes one message may have (a client sending more is broken or
/// hostile; the largest real requests are a few KiB).
pub const MAX_MESSAGE: usize = 16 << 20;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The client closed its side.
    #[error("the client closed the connection")]
    Closed,
    /// I/O failure.
    #[error("reading from the client failed: {0}")]
    Io(#[from] std::io::Error),
    /// A header block without a usable Content-Length.
    #[error("bad message header: {0}")]
    Header(String),
    /// The body is not JSON.
    #[error("a message is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Reads one message. `Closed` at a clean end of input between messages.
pub async fn read_message<R: AsyncBufRead + Unpin>(
    r: &mut R,
) -> Result<serde_json::Value, WireError> {
    let mut length: Option<usize> = None;
    let mut line = String::new();
    let mut first = true;
    loop {
        line.clear();
        let n = r.read_line(&mut line).await?;
        if n == 0 {
            return Err(if first {
                WireError::Closed
            } else {
                WireError::Header("input ended inside a header".into())
            });
        }
        first = false;
        if line.len() > 1024 {
            return Err(WireError::Header("header line longer than 1 KiB".into()));
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            return Err(WireError::Header(format!("{l:?} is not `Name: value`")));
        };
        if name.trim().eq_ignore_ascii_case("content-length") {
            let v = value.trim();
            length = Some(
                v.parse()
                    .map_err(|_| WireError::Header(format!("Content-Length {v:?}")))?,
            );
        }
    }
    let len = length.ok_or_else(|| WireError::Header("no Content-Length".into()))?;
    if len > MAX_MESSAGE {
        return Err(WireError::Header(format!(
            "Content-Length {len} is more than {MAX_MESSAGE}"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

/// Writes one message.
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &serde_json::Value,
) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    let mut out = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(&body);
    w.write_all(&out).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_messages_back_to_back_and_ignores_other_headers() {
        let input = b"Content-Length: 13\r\n\r\n{\"seq\":1,\"a\":2}".to_vec();
        // 13 is short of the body: a wrong length is caught as bad JSON.
        let mut r = tokio::io::BufReader::new(&input[..]);
        assert!(matches!(
            read_message(&mut r).await,
            Err(WireError::Json(_))
        ));

        let mut input = Vec::new();
        for m in [r#"{"seq":1}"#, r#"{"seq":2,"x":"é"}"#] {
            input.extend_from_slice(
                format!(
                    "Content-Type: application/vscode-jsonrpc\r\ncontent-length: {}\r\n\r\n{m}",
                    m.len()
                )
                .as_bytes(),
            );
        }
        let mut r = tokio::io::BufReader::new(&input[..]);
        assert_eq!(read_message(&mut r).await.unwrap()["seq"], 1);
        assert_eq!(read_message(&mut r).await.unwrap()["x"], "é");
        assert!(matches!(read_message(&mut r).await, Err(WireError::Closed)));
    }

    #[tokio::test]
    async fn refuses_headers_without_a_length_and_huge_bodies() {
        let mut r = tokio::io::BufReader::new(&b"X: 1\r\n\r\n{}"[..]);
        assert!(matches!(
            read_message(&mut r).await,
            Err(WireError::Header(_))
        ));
        let big = format!("Content-Length: {}\r\n\r\n", MAX_MESSAGE + 1);
        let mut r = tokio::io::BufReader::new(big.as_bytes());
        assert!(matches!(
            read_message(&mut r).await,
            Err(WireError::Header(_))
        ));
    }

    #[tokio::test]
    async fn writes_what_it_reads() {
        let mut out = Vec::new();
        let v = serde_json::json!({"seq": 3, "type": "event", "event": "initialized"});
        write_message(&mut out, &v).await.unwrap();
        let mut r = tokio::io::BufReader::new(&out[..]);
        assert_eq!(read_message(&mut r).await.unwrap(), v);
    }
}
