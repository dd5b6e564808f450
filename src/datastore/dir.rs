//! The directory datastore: a directory of manifests (the demo, the e2e suite, and nodes
//! without an API server). It is watched with `notify`; after a burst of file events settles,
//! the directory is rescanned and compared with what was read before, so only objects that
//! really changed become events. A whole rescan (instead of per-file bookkeeping) keeps
//! objects that move between files right; directories here hold hundreds of objects, not
//! the cluster.
//!
//! A file that cannot be read or holds a broken document keeps the objects it had before:
//! half-written files must not delete policies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::Context;
use notify::{RecursiveMode, Watcher};
use tracing::{debug, warn};

use super::manifests::{manifest_files, parse_manifests};
use super::EventSink;
use crate::model::{DatastoreEvent, K8sObject, ObjectRef};

/// How long file events must pause before the directory is rescanned.
const SETTLE: Duration = Duration::from_millis(30);

pub struct DirSource {
    root: PathBuf,
    known: BTreeMap<ObjectRef, (PathBuf, K8sObject)>,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> DirSource {
        DirSource {
            root: root.into(),
            known: BTreeMap::new(),
        }
    }

    /// Reads the directory and returns the events that lead from what was known to what is
    /// on disk now.
    pub fn rescan(&mut self) -> anyhow::Result<Vec<DatastoreEvent>> {
        let files = manifest_files(std::slice::from_ref(&self.root))?;
        let mut now: BTreeMap<ObjectRef, (PathBuf, K8sObject)> = BTreeMap::new();
        let mut unreadable: BTreeSet<PathBuf> = BTreeSet::new();
        for file in files {
            match std::fs::read_to_string(&file) {
                Ok(text) => {
                    let (objects, errors) = parse_manifests(&text, &file.display().to_string());
                    for e in &errors {
                        warn!("{e}");
                    }
                    if !errors.is_empty() {
                        crate::telemetry::metrics::global()
                            .rejections
                            .with_label_values(&["Manifest", "parse"])
                            .inc_by(errors.len() as u64);
                    }
                    if !errors.is_empty() {
                        unreadable.insert(file.clone());
                    }
                    for o in objects {
                        now.insert(o.object_ref(), (file.clone(), o));
                    }
                }
                // Deleted between listing and reading: its objects are gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(file = %file.display(), "cannot read manifest: {e}");
                    unreadable.insert(file);
                }
            }
        }
        for (r, (file, o)) in &self.known {
            if unreadable.contains(file) && !now.contains_key(r) {
                now.insert(r.clone(), (file.clone(), o.clone()));
            }
        }

        let mut events = Vec::new();
        for r in self.known.keys() {
            if !now.contains_key(r) {
                events.push(DatastoreEvent::Delete(r.clone()));
            }
        }
        for (r, (_, o)) in &now {
            if self.known.get(r).map(|(_, old)| old) != Some(o) {
                events.push(DatastoreEvent::Upsert(Box::new(o.clone())));
            }
        }
        self.known = now;
        Ok(events)
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
                let _watcher = watcher;
                for e in initial {
                    if !tx.deliver(e) {
                        return;
                    }
                }
                if !tx.deliver(DatastoreEvent::InSync) {
                    return;
                }
                self.follow(&fs_rx, &tx);
            })?;
        Ok(handle)
    }

    fn follow(&mut self, fs_rx: &Receiver<notify::Result<notify::Event>>, tx: &impl EventSink) {
        loop {
            match fs_rx.recv() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => warn!("file watcher: {e}"),
                Err(_) => return,
            }
            // Let the burst settle (an editor or `kubectl`-style write is several events).
            loop {
                match fs_rx.recv_timeout(SETTLE) {
                    Ok(_) => continue,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            match self.rescan() {
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
}
