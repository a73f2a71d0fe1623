//! `wpctl threads`: per-thread debug-register slot occupancy (ListThreads).

use clap::Args;
use serde_json::{Value, json};
use wpd_proto::v1::{ListThreadsRequest, ListThreadsResponse, SlotInfo, SlotState, ThreadState};

use crate::args::pid_parser;
use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output::{self, Table};

/// `wpctl threads`.
#[derive(Debug, Args)]
pub struct ThreadsArgs {
    /// Attached process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Only these threads (repeat or comma-separate)
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
    /// Ask the kernel which slots are really free (marks refused slots foreign)
    #[arg(long)]
    pub probe: bool,
}

/// Runs `wpctl threads`.
pub async fn run(ctx: &Ctx, args: &ThreadsArgs) -> Result<(), Error> {
    report(ctx, args).await?.emit(ctx.json)
}

/// Asks the daemon and renders its answer.
pub async fn report(ctx: &Ctx, args: &ThreadsArgs) -> Result<Report, Error> {
    let request = ListThreadsRequest {
        pid: args.pid,
        tids: args.tids.clone(),
        probe: args.probe,
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.list_threads(r).await })
        .await?;
    Ok(Report::new(to_text(&resp), to_json(&resp)))
}

/// Slots per thread: as reported, or more if a thread lists more.
fn slot_count(resp: &ListThreadsResponse) -> usize {
    resp.threads
        .iter()
        .flat_map(|t| &t.slots)
        .map(|s| s.index as usize + 1)
        .chain([resp.slots_per_thread as usize])
        .max()
        .unwrap_or(0)
}

/// Counts of slots by state: (free, ours, foreign, pending, retained).
fn counts(resp: &ListThreadsResponse) -> [usize; 5] {
    let mut c = [0; 5];
    for slot in resp.threads.iter().flat_map(|t| &t.slots) {
        match SlotState::try_from(slot.state) {
            Ok(SlotState::Free) => c[0] += 1,
            Ok(SlotState::Ours) => c[1] += 1,
            Ok(SlotState::Foreign) => c[2] += 1,
            Ok(SlotState::Pending) => c[3] += 1,
            Ok(SlotState::Retained) => c[4] += 1,
            _ => {}
        }
    }
    c
}

/// Counts of threads by state: (running, stopped at hit, stopped by peer,
/// job-stopped).
fn thread_counts(resp: &ListThreadsResponse) -> [usize; 4] {
    let mut c = [0; 4];
    for th in &resp.threads {
        match ThreadState::try_from(th.state) {
            Ok(ThreadState::Running) => c[0] += 1,
            Ok(ThreadState::StoppedAtHit) => c[1] += 1,
            Ok(ThreadState::StoppedByPeer) => c[2] += 1,
            Ok(ThreadState::JobStopped) => c[3] += 1,
            _ => {}
        }
    }
    c
}

/// One table cell: `-` free, `#<id>` ours, `foreign`, `pending`, `retained`.
fn cell(slot: Option<&SlotInfo>) -> String {
    let Some(slot) = slot else {
        return "?".into();
    };
    match SlotState::try_from(slot.state) {
        Ok(SlotState::Free) => "-".into(),
        Ok(SlotState::Ours) => format!("#{}", slot.watchpoint_id),
        Ok(SlotState::Foreign) => "foreign".into(),
        Ok(SlotState::Pending) => "pending".into(),
        Ok(SlotState::Retained) => "retained".into(),
        _ => "?".into(),
    }
}

/// A table (TID NAME STATE SLOT0..), then a footer:
/// `pid 123: 3 threads, 2 stopped by wpd, 1 job-stopped; slots: 8 free, 2
/// ours, 0 foreign, 0 pending, 2 retained` (thread-state counts only when
/// not zero).
fn to_text(resp: &ListThreadsResponse) -> String {
    let n = slot_count(resp);
    let mut t = Table::new(
        ["TID".to_string(), "NAME".to_string(), "STATE".to_string()]
            .into_iter()
            .chain((0..n).map(|i| format!("SLOT{i}"))),
    );
    for th in &resp.threads {
        let mut row = vec![
            th.tid.to_string(),
            output::name_or_dash(&th.name),
            output::thread_state_label(th.state),
        ];
        row.extend((0..n).map(|i| cell(th.slots.iter().find(|s| s.index as usize == i))));
        t.row(row);
    }
    let [free, ours, foreign, pending, retained] = counts(resp);
    let [_, at_hit, by_peer, job_stopped] = thread_counts(resp);
    let mut text = if resp.threads.is_empty() {
        String::new()
    } else {
        t.render() + "\n"
    };
    text.push_str(&format!(
        "pid {}: {}",
        resp.pid,
        output::plural(resp.threads.len() as u64, "thread")
    ));
    if at_hit + by_peer > 0 {
        text.push_str(&format!(", {} stopped by wpd", at_hit + by_peer));
    }
    if job_stopped > 0 {
        text.push_str(&format!(", {job_stopped} job-stopped"));
    }
    text.push_str(&format!(
        "; slots: {free} free, {ours} ours, {foreign} foreign, {pending} pending, \
         {retained} retained\n"
    ));
    text
}

fn to_json(resp: &ListThreadsResponse) -> Value {
    let [free, ours, foreign, pending, retained] = counts(resp);
    let [running, at_hit, by_peer, job_stopped] = thread_counts(resp);
    json!({
        "pid": resp.pid,
        "slots_per_thread": resp.slots_per_thread,
        "threads": resp.threads.iter().map(|th| json!({
            "tid": th.tid,
            "name": th.name,
            "state": output::thread_state_name(th.state),
            "parent_tid": th.parent_tid,
            "slots": th.slots.iter().map(|s| {
                let holds = matches!(
                    SlotState::try_from(s.state),
                    Ok(SlotState::Ours | SlotState::Pending)
                );
                json!({
                    "index": s.index,
                    "state": output::slot_state_name(s.state),
                    "watchpoint_id": if holds { json!(s.watchpoint_id) } else { Value::Null },
                    "piece": if holds { json!(s.piece) } else { Value::Null },
                })
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "counts": {
            "free": free,
            "ours": ours,
            "foreign": foreign,
            "pending": pending,
            "retained": retained,
        },
        "thread_counts": {
            "running": running,
            "stopped_at_hit": at_hit,
            "stopped_by_peer": by_peer,
            "job_stopped": job_stopped,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use wpd_proto::v1::ThreadInfo;

    fn slot(index: u32, state: SlotState, id: u64) -> SlotInfo {
        SlotInfo {
            piece: 0,
            index,
            state: state as i32,
            watchpoint_id: id,
        }
    }

    fn thread(tid: i32, name: &str, state: ThreadState, slots: Vec<SlotInfo>) -> ThreadInfo {
        ThreadInfo {
            tid,
            name: name.into(),
            state: state as i32,
            slots,
            ..Default::default()
        }
    }

    #[test]
    fn renders() {
        let resp = ListThreadsResponse {
            pid: 123,
            slots_per_thread: 4,
            threads: vec![
                thread(
                    123,
                    "main",
                    ThreadState::Running,
                    vec![
                        slot(0, SlotState::Ours, 7),
                        slot(1, SlotState::Free, 0),
                        slot(2, SlotState::Free, 0),
                        slot(3, SlotState::Free, 0),
                    ],
                ),
                thread(
                    124,
                    "",
                    ThreadState::Unspecified,
                    vec![
                        slot(0, SlotState::Ours, 7),
                        slot(1, SlotState::Foreign, 0),
                        slot(2, SlotState::Pending, 8),
                        slot(3, SlotState::Free, 0),
                    ],
                ),
            ],
        };
        expect![[r#"
            TID  NAME  STATE    SLOT0  SLOT1    SLOT2    SLOT3
            123  main  running  #7     -        -        -
            124  -     -        #7     foreign  pending  -

            pid 123: 2 threads; slots: 4 free, 2 ours, 1 foreign, 1 pending, 0 retained
        "#]]
        .assert_eq(&to_text(&resp));
        let v = to_json(&resp);
        assert_eq!(v["threads"][0]["state"], "running");
        assert_eq!(v["threads"][1]["slots"][1]["state"], "foreign");
        assert!(v["threads"][1]["slots"][1]["watchpoint_id"].is_null());
        assert_eq!(v["threads"][1]["slots"][2]["watchpoint_id"], 8);
        assert_eq!(v["counts"]["free"], 4);
        assert_eq!(v["counts"]["retained"], 0);
    }

    #[test]
    fn renders_stopped_threads_and_retained_slots() {
        let resp = ListThreadsResponse {
            pid: 200,
            slots_per_thread: 4,
            threads: vec![
                thread(
                    200,
                    "main",
                    ThreadState::StoppedByPeer,
                    vec![slot(0, SlotState::Ours, 9), slot(1, SlotState::Retained, 0)],
                ),
                thread(
                    201,
                    "worker",
                    ThreadState::StoppedAtHit,
                    vec![slot(0, SlotState::Ours, 9)],
                ),
                thread(
                    202,
                    "io",
                    ThreadState::JobStopped,
                    vec![slot(0, SlotState::Retained, 0)],
                ),
            ],
        };
        expect![[r#"
            TID  NAME    STATE           SLOT0     SLOT1     SLOT2  SLOT3
            200  main    stopped (peer)  #9        retained  ?      ?
            201  worker  stopped (hit)   #9        ?         ?      ?
            202  io      job-stopped     retained  ?         ?      ?

            pid 200: 3 threads, 2 stopped by wpd, 1 job-stopped; slots: 0 free, 2 ours, 0 foreign, 0 pending, 2 retained
        "#]].assert_eq(&to_text(&resp));
        let v = to_json(&resp);
        assert_eq!(v["threads"][0]["state"], "stopped_by_peer");
        assert_eq!(v["threads"][1]["state"], "stopped_at_hit");
        assert_eq!(v["threads"][2]["state"], "job_stopped");
        assert_eq!(v["threads"][0]["slots"][1]["state"], "retained");
        assert!(v["threads"][0]["slots"][1]["watchpoint_id"].is_null());
        assert_eq!(v["counts"]["retained"], 2);
        assert_eq!(v["thread_counts"]["stopped_at_hit"], 1);
        assert_eq!(v["thread_counts"]["stopped_by_peer"], 1);
        assert_eq!(v["thread_counts"]["job_stopped"], 1);
        assert_eq!(v["thread_counts"]["running"], 0);
    }
}
