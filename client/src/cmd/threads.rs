//! `wpctl threads`: per-thread debug-register slot occupancy (ListThreads).

use serde_json::{Value, json};
use wpd_proto::v1::{ListThreadsRequest, ListThreadsResponse, SlotInfo, SlotState};

use crate::ThreadsArgs;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output::{self, Table};

/// Runs `wpctl threads`.
pub async fn run(ctx: &Ctx, args: &ThreadsArgs) -> Result<(), Error> {
    let request = ListThreadsRequest {
        pid: args.pid,
        tids: args.tids.clone(),
        probe: args.probe,
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.list_threads(r).await })
        .await?;
    if ctx.json {
        output::emit_json(&to_json(&resp))
    } else {
        output::emit(&to_text(&resp))
    }
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

/// Counts of slots by state: (free, ours, foreign, pending).
fn counts(resp: &ListThreadsResponse) -> [usize; 4] {
    let mut c = [0; 4];
    for slot in resp.threads.iter().flat_map(|t| &t.slots) {
        match SlotState::try_from(slot.state) {
            Ok(SlotState::Free) => c[0] += 1,
            Ok(SlotState::Ours) => c[1] += 1,
            Ok(SlotState::Foreign) => c[2] += 1,
            Ok(SlotState::Pending) => c[3] += 1,
            _ => {}
        }
    }
    c
}

/// One table cell: `-` free, `#<id>` ours, `foreign`, `pending`.
fn cell(slot: Option<&SlotInfo>) -> String {
    let Some(slot) = slot else {
        return "?".into();
    };
    match SlotState::try_from(slot.state) {
        Ok(SlotState::Free) => "-".into(),
        Ok(SlotState::Ours) => format!("#{}", slot.watchpoint_id),
        Ok(SlotState::Foreign) => "foreign".into(),
        Ok(SlotState::Pending) => "pending".into(),
        _ => "?".into(),
    }
}

fn to_text(resp: &ListThreadsResponse) -> String {
    let n = slot_count(resp);
    let mut t = Table::new(
        ["TID".to_string(), "NAME".to_string()]
            .into_iter()
            .chain((0..n).map(|i| format!("SLOT{i}"))),
    );
    for th in &resp.threads {
        let mut row = vec![
            th.tid.to_string(),
            if th.name.is_empty() {
                "-".into()
            } else {
                th.name.clone()
            },
        ];
        row.extend((0..n).map(|i| cell(th.slots.iter().find(|s| s.index as usize == i))));
        t.row(row);
    }
    let [free, ours, foreign, pending] = counts(resp);
    let mut text = if resp.threads.is_empty() {
        String::new()
    } else {
        t.render() + "\n"
    };
    text.push_str(&format!(
        "pid {}: {}; slots: {free} free, {ours} ours, {foreign} foreign, {pending} pending\n",
        resp.pid,
        output::plural(resp.threads.len() as u64, "thread"),
    ));
    text
}

fn to_json(resp: &ListThreadsResponse) -> Value {
    let [free, ours, foreign, pending] = counts(resp);
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
                })
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "counts": { "free": free, "ours": ours, "foreign": foreign, "pending": pending },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::ThreadInfo;

    fn slot(index: u32, state: SlotState, id: u64) -> SlotInfo {
        SlotInfo {
            index,
            state: state as i32,
            watchpoint_id: id,
        }
    }

    #[test]
    fn renders() {
        let resp = ListThreadsResponse {
            pid: 123,
            slots_per_thread: 4,
            threads: vec![
                ThreadInfo {
                    tid: 123,
                    name: "main".into(),
                    slots: vec![
                        slot(0, SlotState::Ours, 7),
                        slot(1, SlotState::Free, 0),
                        slot(2, SlotState::Free, 0),
                        slot(3, SlotState::Free, 0),
                    ],
                    ..Default::default()
                },
                ThreadInfo {
                    tid: 124,
                    name: String::new(),
                    slots: vec![
                        slot(0, SlotState::Ours, 7),
                        slot(1, SlotState::Foreign, 0),
                        slot(2, SlotState::Pending, 8),
                        slot(3, SlotState::Free, 0),
                    ],
                    ..Default::default()
                },
            ],
        };
        assert_eq!(
            to_text(&resp),
            "TID  NAME  SLOT0  SLOT1    SLOT2    SLOT3\n\
             123  main  #7     -        -        -\n\
             124  -     #7     foreign  pending  -\n\
             \n\
             pid 123: 2 threads; slots: 4 free, 2 ours, 1 foreign, 1 pending\n"
        );
        let v = to_json(&resp);
        assert_eq!(v["threads"][1]["slots"][1]["state"], "foreign");
        assert!(v["threads"][1]["slots"][1]["watchpoint_id"].is_null());
        assert_eq!(v["threads"][1]["slots"][2]["watchpoint_id"], 8);
        assert_eq!(v["counts"]["free"], 4);
    }
}
