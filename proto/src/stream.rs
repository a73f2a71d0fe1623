//! What the server's `StreamEvents` sends: a `StreamEventsResponse`, as a
//! message or as the bytes of one already encoded (the daemon encodes each
//! event once and sends those bytes to every subscriber that gets them as
//! they are). On the wire the two are the same: a client decodes a
//! `StreamEventsResponse` either way.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};

use crate::v1::StreamEventsResponse;

/// One `StreamEventsResponse` on its way out.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEventsItem {
    /// A message, encoded by prost as it is sent.
    Message(Box<StreamEventsResponse>),
    /// The bytes of a `StreamEventsResponse`, sent as they are.
    Encoded(Bytes),
}

impl Default for StreamEventsItem {
    fn default() -> Self {
        StreamEventsItem::Message(Box::default())
    }
}

impl From<StreamEventsResponse> for StreamEventsItem {
    fn from(m: StreamEventsResponse) -> Self {
        StreamEventsItem::Message(Box::new(m))
    }
}

impl StreamEventsItem {
    /// The message (bytes are decoded).
    pub fn into_message(self) -> Result<StreamEventsResponse, prost::DecodeError> {
        match self {
            StreamEventsItem::Message(m) => Ok(*m),
            StreamEventsItem::Encoded(b) => prost::Message::decode(b),
        }
    }
}

impl prost::Message for StreamEventsItem {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            StreamEventsItem::Message(m) => m.encode_raw(buf),
            StreamEventsItem::Encoded(b) => buf.put_slice(b),
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if let StreamEventsItem::Encoded(_) = self {
            let m = std::mem::take(self).into_message()?;
            *self = StreamEventsItem::from(m);
        }
        let StreamEventsItem::Message(m) = self else {
            unreachable!("made a message above")
        };
        m.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        match self {
            StreamEventsItem::Message(m) => m.encoded_len(),
            StreamEventsItem::Encoded(b) => b.len(),
        }
    }

    fn clear(&mut self) {
        *self = StreamEventsItem::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::stream_events_response::Event;
    use crate::v1::{ProcessOwner, ThreadExited};
    use prost::Message;

    fn message() -> StreamEventsResponse {
        StreamEventsResponse {
            seq: 300,
            time_ns: 1_800_000_000_000_000_000,
            owner: Some(ProcessOwner {
                start_time: 5,
                uids: vec![1000, 0, 1000],
                gids: vec![100, 100, 0],
                dumpable: true,
            }),
            event: Some(Event::ThreadExited(ThreadExited { pid: 7, tid: 8 })),
        }
    }

    #[test]
    fn both_forms_encode_to_the_message_bytes() {
        let bytes = message().encode_to_vec();
        let as_message = StreamEventsItem::from(message());
        let as_bytes = StreamEventsItem::Encoded(Bytes::from(bytes.clone()));
        assert_eq!(as_message.encode_to_vec(), bytes);
        assert_eq!(as_bytes.encode_to_vec(), bytes);
        assert_eq!(as_bytes.encoded_len(), bytes.len());
        // Length-delimited as a field of something else, too.
        assert_eq!(
            as_bytes.encode_length_delimited_to_vec(),
            message().encode_length_delimited_to_vec()
        );
    }

    #[test]
    fn decoding_yields_the_message_and_merges_into_bytes() {
        let bytes = message().encode_to_vec();
        let decoded = StreamEventsItem::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded, StreamEventsItem::from(message()));
        // Merging a later seq into encoded bytes: protobuf's last-wins.
        let mut item = StreamEventsItem::Encoded(Bytes::from(bytes));
        let later = StreamEventsResponse {
            seq: 301,
            ..Default::default()
        };
        item.merge(later.encode_to_vec().as_slice()).unwrap();
        let mut want = message();
        want.seq = 301;
        assert_eq!(item.into_message().unwrap(), want);
        let mut bad = StreamEventsItem::Encoded(Bytes::from_static(&[0xff]));
        assert!(
            bad.merge(&[8u8, 1][..]).is_err(),
            "bytes that do not decode"
        );
    }
}
