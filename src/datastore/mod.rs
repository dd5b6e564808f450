//! Where Kubernetes objects come from: manifests on disk (`manifests`), a watched directory
//! of them (`dir`), the Kubernetes API (`kube`). Every source emits the same
//! [`DatastoreEvent`](crate::model::DatastoreEvent)s into whatever channel it is given and
//! knows nothing of who consumes them.

pub mod dir;
pub mod kube;
pub mod limits;
pub mod manifests;

use std::sync::mpsc::Sender;

use crate::model::DatastoreEvent;

/// Where a source delivers its events: any channel whose items can be made from a
/// [`DatastoreEvent`], so the consumer can carry its other inputs on the same channel without
/// the sources knowing about them.
pub trait EventSink: Send + 'static {
    /// Delivers one event; `false` once the consumer has gone away.
    fn deliver(&self, event: DatastoreEvent) -> bool;
}

impl<T: From<DatastoreEvent> + Send + 'static> EventSink for Sender<T> {
    fn deliver(&self, event: DatastoreEvent) -> bool {
        self.send(event.into()).is_ok()
    }
}
