//! The directory datastore: a directory of manifests (the demo, the e2e suite, and nodes
//! without an API server). It is watched with `notify`; after a burst of real file changes
//! settles, the directory is rescanned and compared with what was read before, so only
//! objects that really changed become events. A whole rescan (instead of per-object
//! bookkeeping by file) keeps objects that move between files right.
//!
//! Quiet at rest: only events that can change files count (created, written, renamed,
//! removed, attributes); the opens, reads and closes of our own rescans never do, so an idle
//! agent never rescans (`netpol_datastore_dir_rescans_total` says how often it did). A rescan
//! re-reads only the files the events named, or whose size, modification time or inode
//! changed; the others keep what was parsed from them.
//!
//! A file that cannot be read or holds a broken document keeps the objects it had before:
//! half-written files must not delete policies. Its problems are logged (and counted) once
//! per version of the file, not at every rescan.
//!
//! The directory itself removed (`rm -rf`, a volume unmounted) is an outage of the datastore,
//! not a deletion of everything: a rescan that would delete objects while the directory is
//! going away is dropped, every object is kept, and the directory is watched for again; once
//! it is back and holds a manifest, and the writes refilling it pause, it is read whole (found
//! by `netpol-e2e chaos --faults`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use serde::Deserialize as _;
use tracing::{debug, warn};

use super::manifests::{manifest_files, parse_manifest_bytes, read_manifest_file};
use super::EventSink;
use crate::model::{DatastoreEvent, K8sObject, ObjectRef};

/// This node's pod ranges from a `Node` manifest in `dir` named `node` (its `spec.podCIDRs`,
/// read as `kube::node_ranges` reads them from the API), for the pending guard; read once at
/// start, like the API's. The agent's objects never include Nodes, so this one reader looks
/// for the one document it needs and nothing else.
pub fn node_pod_ranges(dir: &Path, node: &str) -> Result<Vec<ipnet::IpNet>, String> {
    let files = manifest_files(&[dir.to_path_buf()]).map_err(|e| format!("{e:#}"))?;
    for file in files {
        let Ok(bytes) = read_manifest_file(&file) else {
            continue;
        };
        for doc in serde_yaml_ng::Deserializer::from_slice(&bytes) {
            let Ok(value) = serde_yaml_ng::Value::deserialize(doc) else {
                continue;
            };
            if value.get("kind").and_then(|k| k.as_str()) != Some("Node")
                || value
                    .get("metadata")
                    .and_then(|m| m.get("name"))
                    .and_then(|n| n.as_str())
                    != Some(node)
            {
                continue;
            }
            let parsed: k8s_openapi::api::core::v1::Node = serde_yaml_ng::from_value(value)
                .map_err(|e| format!("{}: Node {node}: {e}", file.display()))?;
            return super::kube::node_ranges::ranges(&parsed);
        }
    }
    Err(format!("no Node {node} in {}", dir.display()))
}

/// How long file events must pause before the directory is rescanned.
const SETTLE: Duration = Duration::from_millis(30);
/// How long a rescan that deletes objects waits to see whether the directory itself is
/// being removed (`rm -rf` empties it first), and how often a removed one is looked for.
const ROOT_CHECK: Duration = Duration::from_millis(250);

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime_ns: i128,
    ino: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ino: meta.ino(),
        }
    }
}

/// What was read from one file.
#[derive(Default)]
struct FileEntry {
    stamp: Option<Stamp>,
    /// The objects the file holds now.
    objects: Vec<Arc<K8sObject>>,
    /// The file is broken (unreadable, or a broken document): the objects it had before and
    /// does not show now, kept until it is fixed.
    kept: Vec<Arc<K8sObject>>,
}

pub struct DirSource {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileEntry>,
    /// Files whose problems were logged, with the version logged.
    told: BTreeMap<PathBuf, Option<Stamp>>,
    /// Paths to read again at the next rescan whatever their stamps say (named by events).
    stale: BTreeSet<PathBuf>,
    known: BTreeMap<ObjectRef, Arc<K8sObject>>,
}

/// Whether a file event can change what the directory holds. Opening, reading and closing a
/// file without writing (which our own rescans do) cannot.
pub fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Remove(_)
        | EventKind::Any
        | EventKind::Other => true,
    }
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> DirSource {
        DirSource {
            root: root.into(),
            files: BTreeMap::new(),
            told: BTreeMap::new(),
            stale: BTreeSet::new(),
            known: BTreeMap::new(),
        }
    }

    /// Reads the directory and returns the events that lead from what was known to what is
    /// on disk now. Files that did not change since the last rescan are not read again.
    pub fn rescan(&mut self) -> anyhow::Result<Vec<DatastoreEvent>> {
        crate::telemetry::metrics::global()
            .datastore_dir_rescans
            .inc();
        let listed: BTreeSet<PathBuf> = manifest_files(std::slice::from_ref(&self.root))?
            .into_iter()
            .collect();
        self.files.retain(|path, _| listed.contains(path));
        self.told.retain(|path, _| listed.contains(path));
        let stale = std::mem::take(&mut self.stale);
        for file in listed {
            let stamp = std::fs::metadata(&file).ok().map(|m| Stamp::of(&m));
            let unchanged = stamp.is_some()
                && !stale.iter().any(|s| file.starts_with(s))
                && self.files.get(&file).is_some_and(|e| e.stamp == stamp);
            if !unchanged {
                self.read_file(file, stamp);
            }
        }

        // What the files hold now first; what broken files keep only where no file holds it.
        let mut now: BTreeMap<ObjectRef, Arc<K8sObject>> = BTreeMap::new();
        for entry in self.files.values() {
            for o in &entry.objects {
                now.insert(o.object_ref(), o.clone());
            }
        }
        for entry in self.files.values() {
            for o in &entry.kept {
                now.entry(o.object_ref()).or_insert_with(|| o.clone());
            }
        }
        let mut events = Vec::new();
        for r in self.known.keys() {
            if !now.contains_key(r) {
                events.push(DatastoreEvent::Delete(r.clone()));
            }
        }
        for (r, o) in &now {
            let same = self
                .known
                .get(r)
                .is_some_and(|old| Arc::ptr_eq(old, o) || old == o);
            if !same {
                events.push(DatastoreEvent::Upsert(Box::new(o.as_ref().clone())));
            }
        }
        self.known = now;
        Ok(events)
    }

    /// Reads and parses one file into `files`. A broken or unreadable file keeps the objects
    /// it had; its problems are logged once per version of the file.
    fn read_file(&mut self, file: PathBuf, stamp: Option<Stamp>) {
        let previous = self.files.remove(&file).unwrap_or_default();
        let mut had: Vec<Arc<K8sObject>> = previous.objects;
        had.extend(previous.kept);
        let problems: Vec<String>;
        let mut objects = Vec::new();
        match read_manifest_file(&file) {
            Ok(bytes) => {
                let (parsed, errors) = parse_manifest_bytes(&bytes, &file.display().to_string());
                objects = parsed.into_iter().map(Arc::new).collect();
                problems = errors.iter().map(ToString::to_string).collect();
                if !problems.is_empty() {
                    crate::telemetry::metrics::global()
                        .rejections
                        .with_label_values(&["Manifest", "parse"])
                        .inc_by(problems.len() as u64);
                }
            }
            // Deleted between listing and reading: its objects are gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => problems = vec![format!("{}: cannot read manifest: {e}", file.display())],
        }
        if problems.is_empty() {
            self.told.remove(&file);
            self.files.insert(
                file,
                FileEntry {
                    stamp,
                    objects,
                    kept: Vec::new(),
                },
            );
            return;
        }
        if self.told.get(&file) != Some(&stamp) {
            for p in &problems {
                warn!("{p}");
            }
            self.told.insert(file.clone(), stamp);
        }
        // The good documents count; what the file had before and does not show now stays
        // (it may be half-written).
        let shown: BTreeSet<ObjectRef> = objects.iter().map(|o| o.object_ref()).collect();
        let kept = had
            .into_iter()
            .filter(|o| !shown.contains(&o.object_ref()))
            .collect();
        self.files.insert(
            file,
            FileEntry {
                stamp,
                objects,
                kept,
            },
        );
    }

    /// Sends the full initial listing followed by `InSync`, then every later change, from a
    /// background thread. Stops when the receiver is dropped.
    pub fn spawn(mut self, tx: impl EventSink) -> anyhow::Result<std::thread::JoinHandle<()>> {
        let (fs_tx, fs_rx) = channel();
        let mut watcher = notify::recommended_watcher(move |res| {
            let _ = fs_tx.send(res);
        })
        .context("cannot start the file watcher")?;
        watcher
            .watch(&self.root, RecursiveMode::Recursive)
            .with_context(|| format!("cannot watch {}", self.root.display()))?;
        let initial = self.rescan()?;
        let handle = std::thread::Builder::new()
            .name("dir-datastore".into())
            .spawn(move || {
                let mut watcher = watcher;
                for e in initial {
                    if !tx.deliver(e) {
                        return;
                    }
                }
                if !tx.deliver(DatastoreEvent::InSync) {
                    return;
                }
                self.follow(&mut watcher, &fs_rx, &tx);
            })?;
        Ok(handle)
    }

    /// Notes what an event says changed; `true` when it can change the directory's contents.
    fn note(&mut self, event: notify::Result<notify::Event>) -> bool {
        match event {
            Ok(event) => {
                if !is_change(&event.kind) {
                    return false;
                }
                if event.need_rescan() || event.paths.is_empty() {
                    self.stale.insert(self.root.clone());
                }
                self.stale.extend(event.paths);
                true
            }
            Err(e) => {
                // The watcher lost track (say, a queue overflow): read everything again.
                warn!("file watcher: {e}");
                self.stale.insert(self.root.clone());
                true
            }
        }
    }

    fn follow(
        &mut self,
        watcher: &mut RecommendedWatcher,
        fs_rx: &Receiver<notify::Result<notify::Event>>,
        tx: &impl EventSink,
    ) {
        let mut rescan_now = false;
        loop {
            // Wait for a real change; our own reads of the files also raise events.
            while !std::mem::take(&mut rescan_now) {
                match fs_rx.recv() {
                    Ok(event) => {
                        if self.note(event) {
                            break;
                        }
                    }
                    Err(_) => return,
                }
            }
            // Let the burst settle (an editor or `kubectl`-style write is several events).
            loop {
                match fs_rx.recv_timeout(SETTLE) {
                    Ok(event) => {
                        self.note(event);
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            let before = self.known.clone();
            let rescanned = self.rescan();
            let deletes = rescanned.as_ref().is_ok_and(|events| {
                events
                    .iter()
                    .any(|e| matches!(e, DatastoreEvent::Delete(_)))
            });
            if (rescanned.is_err() || deletes) && self.root_gone() {
                warn!(
                    dir = %self.root.display(),
                    "the directory is gone: keeping every object, waiting for it to come back"
                );
                self.known = before;
                if !self.await_root(watcher, fs_rx) {
                    return;
                }
                rescan_now = true;
                continue;
            }
            match rescanned {
                Ok(events) => {
                    debug!(events = events.len(), "directory changed");
                    for e in events {
                        if !tx.deliver(e) {
                            return;
                        }
                    }
                }
                Err(e) => {
                    warn!(dir = %self.root.display(), "rescan failed, keeping what was read: {e:#}")
                }
            }
        }
    }

    /// Whether the root directory is gone or going: missing now, or after a short wait
    /// (a recursive removal deletes the files first).
    fn root_gone(&self) -> bool {
        if !self.root.is_dir() {
            return true;
        }
        std::thread::sleep(ROOT_CHECK);
        !self.root.is_dir()
    }

    /// Waits until the root directory exists again and watches it; `false` when the watcher
    /// went away. Everything is read again at the next rescan.
    fn await_root(
        &mut self,
        watcher: &mut RecommendedWatcher,
        fs_rx: &Receiver<notify::Result<notify::Event>>,
    ) -> bool {
        loop {
            match fs_rx.recv_timeout(ROOT_CHECK) {
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return false,
            }
            // Back once it holds a manifest again: a directory just made is still being filled.
            let filled = self.root.is_dir()
                && manifest_files(std::slice::from_ref(&self.root)).is_ok_and(|f| !f.is_empty());
            if !filled {
                continue;
            }
            // The old watch died with the old directory; a failed unwatch says only that.
            let _ = watcher.unwatch(&self.root);
            match watcher.watch(&self.root, RecursiveMode::Recursive) {
                Ok(()) => {
                    // Until the writes that refill it pause.
                    loop {
                        match fs_rx.recv_timeout(ROOT_CHECK) {
                            Ok(_) => {}
                            Err(RecvTimeoutError::Timeout) => break,
                            Err(RecvTimeoutError::Disconnected) => return false,
                        }
                    }
                    self.stale.insert(self.root.clone());
                    self.files.clear();
                    debug!(dir = %self.root.display(), "the directory is back");
                    return true;
                }
                Err(e) => debug!(dir = %self.root.display(), "cannot watch yet: {e}"),
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    const POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\nspec: {podSelector: {}}\n";
    const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n";

    #[test]
    fn rescan_reports_only_changes() {
        let dir = std::env::temp_dir().join(format!("npa-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(&dir, "a.yaml", POLICY);
        write(&dir, "b.yaml", NS);
        let mut src = DirSource::new(&dir);
        assert_eq!(src.rescan().unwrap().len(), 2);
        assert!(src.rescan().unwrap().is_empty(), "nothing changed");

        // Moving an object to another file is no change at all.
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        write(&dir, "c.yaml", POLICY);
        assert!(src.rescan().unwrap().is_empty());

        // A broken file keeps its objects; fixing it with a change is one upsert.
        write(&dir, "c.yaml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x\n");
        assert!(src.rescan().unwrap().is_empty());
        write(
            &dir,
            "c.yaml",
            &POLICY.replace("podSelector: {}", "podSelector: {matchLabels: {a: b}}"),
        );
        let events = src.rescan().unwrap();
        assert!(matches!(
            events.as_slice(),
            [DatastoreEvent::Upsert(o)] if matches!(o.as_ref(), K8sObject::NetworkPolicy(_))
        ));

        std::fs::remove_file(dir.join("c.yaml")).unwrap();
        let events = src.rescan().unwrap();
        assert!(matches!(events.as_slice(), [DatastoreEvent::Delete(r)] if r.key == "x/p"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_removed_directory_deletes_nothing_and_is_followed_once_back() {
        let dir = std::env::temp_dir().join(format!("npa-dir-gone-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        write(&dir, "a.yaml", POLICY);
        write(&dir.join("sub"), "b.yaml", NS);
        let (tx, rx) = channel::<DatastoreEvent>();
        let _thread = DirSource::new(&dir).spawn(tx).unwrap();
        let mut initial = 0;
        while !matches!(rx.recv().unwrap(), DatastoreEvent::InSync) {
            initial += 1;
        }
        assert_eq!(initial, 2);

        std::fs::remove_dir_all(&dir).unwrap();
        let during: Vec<_> = rx
            .recv_timeout(Duration::from_secs(1))
            .into_iter()
            .collect();
        assert!(
            during.is_empty(),
            "nothing changes while it is gone: {during:?}"
        );

        // Back, with the policy changed and the namespace as it was.
        std::fs::create_dir_all(&dir).unwrap();
        let changed = POLICY.replace("podSelector: {}", "podSelector: {matchLabels: {a: b}}");
        write(&dir, "a.yaml", &changed);
        write(&dir, "b.yaml", NS);
        let event = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the directory is followed again");
        assert!(
            matches!(&event, DatastoreEvent::Upsert(o) if matches!(o.as_ref(), K8sObject::NetworkPolicy(_))),
            "{event:?}"
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the namespace was never deleted, so it is no change"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
