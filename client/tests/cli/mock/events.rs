//! The mock's event streams, scripted by pid, and the hits its
//! watchpoints kept.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;

use super::fixtures::{break_stop, event, hit, numbered_hit, stopping_hit};
use super::{EventStream, served};

/// The messages the mock scripts, before they are served.
type Events = Pin<Box<dyn Stream<Item = Result<StreamEventsResponse, Status>> + Send>>;

/// pid 1: three events, then the stream ends. pid 2: a hit every 5 ms,
/// forever. pid 3: one stopping only-on-change hit, then the end.
/// pid 4: one symbolized hit with a backtrace, then the end.
/// pid 6: no journal (a replay is refused with reason NO_JOURNAL).
/// pid 7: echoes the replay fields: `after_seq` N gives the hits N+1 and
/// N+2, `since_time_ns` T one hit at time T (seq 1), then the end.
/// pid 4: two hits at the same places, sent once (`places_once`, which
/// the caller must ask for).
/// Otherwise: a hit, a drop notice, a thread start, then silence.
pub(super) fn stream_events(
    r: Request<StreamEventsRequest>,
) -> Result<Response<EventStream>, Status> {
    let req = r.get_ref();
    let replaying = req.after_seq.is_some() || req.since_time_ns.is_some();
    if req.pid == 4 && !req.places_once {
        return Err(Status::invalid_argument(
            "the located hits of pid 4 are for a stream with places once",
        ));
    }
    if req.pid == 6 && replaying {
        let mut details = ErrorDetails::new();
        details.set_error_info(wpd_proto::reason::NO_JOURNAL, "wpd.v1", HashMap::new());
        return Err(Status::with_error_details(
            Code::FailedPrecondition,
            "no journal",
            details,
        ));
    }
    if req.pid == 7 {
        let events = match (req.after_seq, req.since_time_ns) {
            (Some(n), _) => vec![Ok(hit(n + 1)), Ok(hit(n + 2))],
            (None, Some(t)) => {
                let mut ev = hit(1);
                ev.time_ns = t;
                vec![Ok(ev)]
            }
            (None, None) => vec![],
        };
        return Ok(Response::new(served(tokio_stream::iter(events))));
    }
    let first = vec![
        Ok(hit(1)),
        Ok(event(
            2,
            Event::Dropped(EventsDropped {
                count: 5,
                first_seq: 1,
                last_seq: 5,
            }),
        )),
        Ok(event(
            3,
            Event::ThreadStarted(ThreadStarted {
                pid: 123,
                tid: 125,
                parent_tid: 124,
                watchpoint_ids: vec![7],
            }),
        )),
    ];
    let stream: Events = match r.into_inner().pid {
        // Code breakpoints (id 9): pid 8's stop is lost to a drop (the
        // stream goes on), pid 9's comes after another breakpoint's,
        // pid 10 exits.
        8 => Box::pin(
            tokio_stream::iter(vec![Ok(event(
                1,
                Event::Dropped(EventsDropped {
                    count: 1,
                    first_seq: 1,
                    last_seq: 1,
                }),
            ))])
            .chain(tokio_stream::pending()),
        ),
        9 => {
            let mut other = break_stop(1, 90);
            if let Some(Event::BreakpointHit(b)) = other.event.as_mut() {
                b.watchpoint_id = 4;
            }
            Box::pin(
                tokio_stream::iter(vec![Ok(other), Ok(break_stop(2, 91))])
                    .chain(tokio_stream::pending()),
            )
        }
        10 => Box::pin(
            tokio_stream::iter(vec![Ok(event(
                1,
                Event::ProcessExited(ProcessExited {
                    pid: 10,
                    watchpoint_ids: vec![9],
                }),
            ))])
            .chain(tokio_stream::pending()),
        ),
        1 => Box::pin(tokio_stream::iter(first)),
        3 => Box::pin(tokio_stream::iter(vec![Ok(stopping_hit(1))])),
        4 => Box::pin(tokio_stream::iter(vec![
            Ok(numbered_hit(1, true)),
            Ok(numbered_hit(2, false)),
        ])),
        2 => {
            let ticks = tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(
                Duration::from_millis(5),
            ));
            let mut seq = 0;
            Box::pin(ticks.map(move |_| {
                seq += 1;
                Ok(hit(seq))
            }))
        }
        _ => Box::pin(tokio_stream::iter(first).chain(tokio_stream::pending())),
    };
    Ok(Response::new(served(stream)))
}

/// Watchpoint 7 kept two hits of 42 in all; others do not exist.
pub(super) fn get_recent_hits(
    r: Request<GetRecentHitsRequest>,
) -> Result<Response<GetRecentHitsResponse>, Status> {
    let r = r.into_inner();
    if r.watchpoint_id == 9 {
        return Ok(Response::new(GetRecentHitsResponse {
            value_type: None,
            hits: vec![break_stop(30, 81)],
            total: 1,
        }));
    }
    if r.watchpoint_id != 7 {
        return Err(Status::not_found(format!(
            "no watchpoint #{}",
            r.watchpoint_id
        )));
    }
    let hit = |seq: u64, tid: i32, value: u8| StreamEventsResponse {
        seq,
        time_ns: 1,
        owner: None,
        event: Some(Event::Hit(Hit {
            process_name: String::new(),
            thread_name: String::new(),
            watchpoint_id: 7,
            pid: 123,
            tid,
            ip: 0x401000,
            address: 0x1040,
            length: 4,
            value: vec![value, 0, 0, 0],
            ..Default::default()
        })),
    };
    let mut hits = vec![hit(40, 124, 1), hit(41, 125, 2)];
    if r.limit == 1 {
        hits.remove(0);
    }
    Ok(Response::new(GetRecentHitsResponse {
        hits,
        total: 42,
        value_type: None,
    }))
}
