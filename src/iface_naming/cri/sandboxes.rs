//! The pod sandboxes the runtime reports, and which one is a pod's: the newest ready sandbox
//! with the pod's UID (a recreated sandbox replaces the old one), kept as a table the watcher
//! updates from the runtime's events.

use super::*;

/// One pod sandbox as the runtime reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxRecord {
    pub id: String,
    /// The pod's namespace and name (sandbox metadata, else the kubelet's labels).
    pub pod: ObjectKey,
    /// The pod's UID (metadata, else label `io.kubernetes.pod.uid`); empty when neither says.
    pub uid: String,
    /// The kubelet's attempt counter: 0 for a pod's first sandbox, +1 for each re-creation.
    pub attempt: u32,
    /// `SANDBOX_READY`: the sandbox is running and its network was set up.
    pub ready: bool,
    /// Creation time, nanoseconds since the epoch.
    pub created_at_ns: i64,
}

impl SandboxRecord {
    pub(super) fn new(
        id: &str,
        metadata: Option<&cri::PodSandboxMetadata>,
        labels: &HashMap<String, String>,
        state: i32,
        created_at_ns: i64,
    ) -> Option<SandboxRecord> {
        let pick = |from_metadata: Option<&str>, label: &str| {
            from_metadata
                .filter(|s| !s.is_empty())
                .or_else(|| labels.get(label).map(String::as_str))
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        if id.is_empty() {
            return None;
        }
        let namespace = pick(metadata.map(|m| m.namespace.as_str()), POD_NAMESPACE_LABEL)?;
        let name = pick(metadata.map(|m| m.name.as_str()), POD_NAME_LABEL)?;
        Some(SandboxRecord {
            id: id.to_string(),
            pod: ObjectKey::new(namespace, name),
            uid: pick(metadata.map(|m| m.uid.as_str()), POD_UID_LABEL).unwrap_or_default(),
            attempt: metadata.map_or(0, |m| m.attempt),
            ready: state == cri::PodSandboxState::SandboxReady as i32,
            created_at_ns,
        })
    }

    /// From a `ListPodSandbox` item; `None` when it names no pod (not the kubelet's).
    pub fn from_sandbox(s: &cri::PodSandbox) -> Option<SandboxRecord> {
        Self::new(&s.id, s.metadata.as_ref(), &s.labels, s.state, s.created_at)
    }

    /// From the `pod_sandbox_status` of a container event.
    pub fn from_status(s: &cri::PodSandboxStatus) -> Option<SandboxRecord> {
        Self::new(&s.id, s.metadata.as_ref(), &s.labels, s.state, s.created_at)
    }

    pub(super) fn belongs_to(&self, pod_uid: Option<&str>) -> bool {
        match pod_uid {
            Some(uid) if !uid.is_empty() => self.uid == uid,
            _ => true,
        }
    }
}

/// The sandbox that names a pod's interface: among `sandboxes` (those of the pod's namespace
/// and name) the READY ones of the pod's UID (any UID when it is unknown), the one created
/// last; ties go to the higher attempt, then the greater ID. `None`: no READY sandbox, no
/// interface.
pub fn select_sandbox<'a>(
    sandboxes: impl IntoIterator<Item = &'a SandboxRecord>,
    pod_uid: Option<&str>,
) -> Option<&'a SandboxRecord> {
    sandboxes
        .into_iter()
        .filter(|s| s.ready && s.belongs_to(pod_uid))
        .max_by(|a, b| {
            (a.created_at_ns, a.attempt, &a.id).cmp(&(b.created_at_ns, b.attempt, &b.id))
        })
}

/// The node's sandboxes, by pod. Every change reports whether anything changed, so the
/// notifier runs only when a resolution may have.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SandboxTable {
    /// Each pod's sandboxes, sorted by ID.
    pub(super) by_pod: HashMap<ObjectKey, Vec<SandboxRecord>>,
    pub(super) pod_of: HashMap<String, ObjectKey>,
}

impl SandboxTable {
    pub(super) fn from_records(records: impl IntoIterator<Item = SandboxRecord>) -> SandboxTable {
        let mut table = SandboxTable::default();
        for record in records {
            table.upsert(record);
        }
        table
    }

    pub(super) fn of_pod(&self, pod: &ObjectKey) -> &[SandboxRecord] {
        self.by_pod.get(pod).map_or(&[], Vec::as_slice)
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.pod_of.contains_key(id)
    }

    pub(super) fn len(&self) -> usize {
        self.pod_of.len()
    }

    pub(super) fn upsert(&mut self, record: SandboxRecord) -> bool {
        if self
            .pod_of
            .get(&record.id)
            .is_some_and(|pod| *pod != record.pod)
        {
            // An ID never moves between pods; if a runtime says so, believe the news.
            self.remove(&record.id);
        }
        let list = self.by_pod.entry(record.pod.clone()).or_default();
        match list.binary_search_by(|r| r.id.cmp(&record.id)) {
            Ok(i) if list[i] == record => false,
            Ok(i) => {
                list[i] = record;
                true
            }
            Err(i) => {
                self.pod_of.insert(record.id.clone(), record.pod.clone());
                list.insert(i, record);
                true
            }
        }
    }

    pub(super) fn remove(&mut self, id: &str) -> bool {
        let Some(pod) = self.pod_of.remove(id) else {
            return false;
        };
        if let Some(list) = self.by_pod.get_mut(&pod) {
            list.retain(|r| r.id != id);
            if list.is_empty() {
                self.by_pod.remove(&pod);
            }
        }
        true
    }

    /// A full listing replaces everything.
    pub(super) fn replace_all(&mut self, records: impl IntoIterator<Item = SandboxRecord>) -> bool {
        let new = SandboxTable::from_records(records);
        let changed = new != *self;
        *self = new;
        changed
    }

    /// A targeted listing: the sandboxes of `pod` (of `uid` when given) are exactly `records`.
    pub(super) fn replace_pod(
        &mut self,
        pod: &ObjectKey,
        uid: Option<&str>,
        records: Vec<SandboxRecord>,
    ) -> bool {
        let gone: Vec<String> = self
            .of_pod(pod)
            .iter()
            .filter(|r| r.belongs_to(uid) && !records.iter().any(|n| n.id == r.id))
            .map(|r| r.id.clone())
            .collect();
        let mut changed = false;
        for id in gone {
            changed |= self.remove(&id);
        }
        for record in records {
            if record.pod == *pod && record.belongs_to(uid) {
                changed |= self.upsert(record);
            }
        }
        changed
    }
}

/// What a container event means for the table.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EventAction {
    Upsert(SandboxRecord),
    Remove(String),
    /// No usable status: ask the runtime for this ID.
    Lookup(String),
}

pub(super) fn event_action(
    table: &SandboxTable,
    event: &cri::ContainerEventResponse,
) -> EventAction {
    let deleted =
        event.container_event_type == cri::ContainerEventType::ContainerDeletedEvent as i32;
    let id = &event.container_id;
    if let Some(status) = &event.pod_sandbox_status {
        if deleted && status.id == *id {
            return EventAction::Remove(id.clone());
        }
        if let Some(record) = SandboxRecord::from_status(status) {
            return EventAction::Upsert(record);
        }
    }
    if deleted && table.contains(id) {
        EventAction::Remove(id.clone())
    } else {
        EventAction::Lookup(id.clone())
    }
}
