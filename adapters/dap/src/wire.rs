//! DAP's base protocol: each message is `Content-Length: N\r\n\r\n` and N
//! bytes of UTF-8 JSON. Other header fields are allowed and ignored.
//!
//! Reading is bounded whatever the peer sends: a header line longer than
//! [`MAX_HEADER_LINE`], a header block longer than [`MAX_HEADER`], or a
//! `Content-Length` above the reader's limit ([`MAX_MESSAGE`] for a session)
//! is refused after at most that many bytes, and a body's buffer grows with
//! the bytes that really arrive, never to a size the peer merely announced.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most bytes one message's body may have in a session (a client sending
/// more is broken or hostile; the largest real requests, a
/// `setDataBreakpoints` with every slot of a thread, are a few KiB).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Most bytes one header line may have, its line end included.
pub const MAX_HEADER_LINE: usize = 1024;

/// Most bytes a message's whole header block may have.
pub const MAX_HEADER: usize = 4096;

/// What a body buffer starts with; it grows as the body arrives.
const FIRST_CHUNK: usize = 64 << 10;

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

/// Reads one message of at most [`MAX_MESSAGE`] bytes. `Closed` at a clean
/// end of input between messages.
pub async fn read_message<R: AsyncBufRead + Unpin>(
    r: &mut R,
) -> Result<serde_json::Value, WireError> {
    read_message_within(r, MAX_MESSAGE).await
}

/// Reads one message whose body has at most `max_body` bytes.
pub async fn read_message_within<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max_body: usize,
) -> Result<serde_json::Value, WireError> {
    let mut length: Option<usize> = None;
    let mut line = Vec::with_capacity(128);
    let mut header_bytes = 0usize;
    loop {
        line.clear();
        // Never more than the line's or the block's remaining allowance.
        let allowance = MAX_HEADER_LINE.min(MAX_HEADER - header_bytes);
        let n = (&mut *r)
            .take(allowance as u64)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Err(if header_bytes == 0 {
                WireError::Closed
            } else {
                WireError::Header("input ended inside a header".into())
            });
        }
        header_bytes += n;
        if line.last() != Some(&b'\n') {
            if n < allowance {
                return Err(WireError::Header("input ended inside a header".into()));
            }
            return Err(WireError::Header(if allowance == MAX_HEADER_LINE {
                format!("a header line longer than {MAX_HEADER_LINE} bytes")
            } else {
                format!("a header block longer than {MAX_HEADER} bytes")
            }));
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            return Err(WireError::Header("a header line is not UTF-8".into()));
        };
        let l = text.trim_end_matches(['\r', '\n']);
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
    if len > max_body {
        return Err(WireError::Header(format!(
            "Content-Length {len} is more than {max_body}"
        )));
    }
    let mut body = Vec::with_capacity(len.min(FIRST_CHUNK));
    (&mut *r).take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(WireError::Header(format!(
            "input ended {} bytes into a body of {len}",
            body.len()
        )));
    }
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

    /// What `read_message` makes of `input`, and how many bytes it took.
    async fn read_counting(input: &[u8]) -> (Result<serde_json::Value, WireError>, u64) {
        let mut cursor = std::io::Cursor::new(input);
        let r = {
            let mut r = tokio::io::BufReader::with_capacity(64, &mut cursor);
            let res = read_message(&mut r).await;
            // Bytes taken from the input and not used are still buffered.
            (res, r.buffer().len() as u64)
        };
        (r.0, cursor.position() - r.1)
    }

    #[tokio::test]
    async fn an_endless_header_is_refused_after_a_bounded_number_of_bytes() {
        // One line with no end.
        let endless = vec![b'a'; 1 << 20];
        let (r, taken) = read_counting(&endless).await;
        assert!(
            matches!(&r, Err(WireError::Header(m)) if m.contains("header line longer")),
            "{r:?}"
        );
        assert_eq!(taken, MAX_HEADER_LINE as u64);
        // An endless Content-Length value.
        let mut digits = b"Content-Length: ".to_vec();
        digits.resize(1 << 20, b'9');
        let (r, taken) = read_counting(&digits).await;
        assert!(matches!(r, Err(WireError::Header(_))), "{r:?}");
        assert_eq!(taken, MAX_HEADER_LINE as u64);
        // Endless short lines.
        let lines = b"X-Filler: 1\r\n".repeat(100_000);
        let (r, taken) = read_counting(&lines).await;
        assert!(
            matches!(&r, Err(WireError::Header(m)) if m.contains("header block longer")),
            "{r:?}"
        );
        assert!(taken <= MAX_HEADER as u64, "{taken}");
    }

    #[tokio::test]
    async fn a_body_is_read_as_it_comes_and_never_past_its_limit() {
        // A length just under the limit with a short body: an error at the
        // end of input, not a wait or an allocation of the announced size.
        let input = format!("Content-Length: {MAX_MESSAGE}\r\n\r\n{{}}");
        let (r, _) = read_counting(input.as_bytes()).await;
        assert!(
            matches!(&r, Err(WireError::Header(m)) if m.contains("input ended 2 bytes into")),
            "{r:?}"
        );
        // Over the limit: refused before any of the body is read.
        let input = format!("Content-Length: {}\r\n\r\n{{}}", MAX_MESSAGE + 1);
        let (r, taken) = read_counting(input.as_bytes()).await;
        assert!(matches!(r, Err(WireError::Header(_))), "{r:?}");
        assert_eq!(taken as usize, input.len() - 2);
        let input = b"Content-Length: 99999999999999999999999\r\n\r\n";
        assert!(matches!(
            read_counting(input).await.0,
            Err(WireError::Header(_))
        ));
        // A smaller limit (for connections being refused).
        let input = b"Content-Length: 100\r\n\r\n";
        let mut r = tokio::io::BufReader::new(&input[..]);
        assert!(matches!(
            read_message_within(&mut r, 99).await,
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
