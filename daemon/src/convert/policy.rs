//! Policies (a watchpoint spec armed in every process a selector picks)
//! from the wire, validated, and back.

use wpd_proto::v1 as pb;

use super::code::code_to_pb;
use super::watch::spec_to_pb;
use crate::error::WpdError;
use crate::model::WatchSpec;

/// A policy's spec from the wire: a watchpoint spec whose pid is 0 (the
/// selector picks the processes), checked as any other.
pub fn policy_spec_from_pb(mut s: pb::WatchpointSpec) -> Result<WatchSpec, WpdError> {
    if s.pid != 0 {
        return Err(WpdError::InvalidArgument(format!(
            "a policy's spec must have pid 0 (its selector picks the processes), got {}",
            s.pid
        )));
    }
    if !s.tids.is_empty() {
        return Err(WpdError::InvalidArgument(
            "a policy's spec cannot name threads (tids are per process)".into(),
        ));
    }
    // Checked as a watchpoint of some process; the pid is each instance's.
    s.pid = 1;
    let mut spec = WatchSpec::try_from(s)?;
    spec.pid = 0;
    Ok(spec)
}

/// A selector from the wire.
pub fn selector_from_pb(
    s: Option<pb::ProcessSelector>,
) -> Result<crate::engine::policy::Selector, WpdError> {
    let s = s.unwrap_or_default();
    crate::engine::policy::Selector::new(s.pids, &s.comm, &s.exe, &s.cgroup)
}

/// How a policy found a process, on the wire.
fn found_by_to_pb(f: crate::engine::policy::FoundBy) -> pb::InstanceSource {
    use crate::engine::policy::FoundBy;
    match f {
        FoundBy::SetPolicy => pb::InstanceSource::SetPolicy,
        FoundBy::KernelRecord => pb::InstanceSource::KernelRecord,
        FoundBy::Scan => pb::InstanceSource::Scan,
        FoundBy::ExecHold => pb::InstanceSource::ExecHold,
    }
}

/// A selector to the wire.
pub fn selector_to_pb(s: &crate::engine::policy::Selector) -> pb::ProcessSelector {
    pb::ProcessSelector {
        pids: s.pids.clone(),
        comm: s.comm.clone().unwrap_or_default(),
        exe: s
            .exe
            .as_ref()
            .map(|e| e.display().to_string())
            .unwrap_or_default(),
        cgroup: s.cgroup.clone().unwrap_or_default(),
    }
}

impl From<&crate::engine::policy::PolicyView> for pb::Policy {
    fn from(p: &crate::engine::policy::PolicyView) -> Self {
        pb::Policy {
            id: p.id.0,
            selector: Some(selector_to_pb(&p.selector)),
            spec: Some({
                let mut spec = spec_to_pb(&p.spec);
                if let Some(code) = &p.code {
                    code_to_pb(&mut spec, code);
                }
                spec
            }),
            created_at_ns: p.created_at_ns,
            instances: p
                .instances
                .iter()
                .map(|i| pb::PolicyInstance {
                    pid: i.pid,
                    comm: i.comm.clone(),
                    watchpoint_id: i.watch.0,
                    armed_at_ns: i.armed_at_ns,
                    latency_ns: i.latency_ns,
                    found_by: found_by_to_pb(i.found_by) as i32,
                })
                .collect(),
            refusals: p
                .refusals
                .iter()
                .map(|r| pb::PolicyRefusal {
                    pid: r.pid,
                    comm: r.comm.clone(),
                    reason: r.reason.clone(),
                    at_ns: r.at_ns,
                })
                .collect(),
            instances_made: p.made,
        }
    }
}
