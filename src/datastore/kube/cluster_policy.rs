//! The follower of kinds whose CRD may be missing: ClusterNetworkPolicy
//! (`policy.networking.k8s.io/v1alpha2` `clusternetworkpolicies`, cluster-scoped) and the
//! staged kinds (`netpol-agent.io/v1alpha1` `stagednetworkpolicies`,
//! `stagedclusternetworkpolicies`, issue 23). It lists and watches them with the same watcher,
//! trimming, mirror and relist rules as the other kinds (`kube`), plus one state they do not
//! have: the resource may not exist. Their CRDs come from network-policy-api or from our
//! `deploy/`, not from Kubernetes, and a cluster may run the agent before (or without)
//! installing them.
//!
//! # A missing CRD
//!
//! When the API server answers 404 for the resource (JSON `Status` or the plain-text
//! `404 page not found`, both reach us as `kube::Error::Api` with code 404):
//! - it is an empty listing: whatever was delivered before is deleted (the CRD was removed,
//!   and the API server removed its objects with it), and the first time it counts as this
//!   kind's first listing, so `InSync` is not held up by a resource that is not there;
//! - it is logged once at warning level when it starts (with what to install), at debug
//!   level on every later check, and at info level when the resource appears;
//! - the resource is looked for again every `KubeOptions::missing_crd_recheck` (30 s by
//!   default) with a fresh watcher, which lists and watches as soon as it is there. It never
//!   ends the datastore and never turns into a fast retry loop.
//!
//! Any other error is handled as for the other kinds (logged, retried with the back-off
//! policy, a 410 restarts with a relist).
//!
//! ClusterNetworkPolicy as an object: its types in `model::cluster_policy`, its watch while the
//! CRD may be missing in `datastore::kube::cluster_policy`.

use std::time::Duration;

use ::kube::runtime::{watcher, WatchStreamExt};
use ::kube::Api;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tracing::{debug, info, warn};

use super::{wait_after_error, Access, Closed, Kind, KubeOptions, Lists, Mirror, Out, Retry};
use crate::model::cluster_policy::{API_VERSION, PLURAL};
use crate::model::staged::{self, StagedClusterNetworkPolicy, StagedNetworkPolicy};
use crate::model::{ClusterNetworkPolicy, K8sObject, ObjectKind, ObjectRef};

/// How often a missing ClusterNetworkPolicy resource is looked for again.
pub const MISSING_CRD_RECHECK: Duration = Duration::from_secs(30);

impl Kind for ClusterNetworkPolicy {
    const KIND: ObjectKind = ObjectKind::ClusterNetworkPolicy;
    fn trim(&mut self) {
        trim_cluster_network_policy(self)
    }
    fn into_object(self) -> K8sObject {
        K8sObject::ClusterNetworkPolicy(self)
    }
    fn datastore_ref(&self) -> ObjectRef {
        ObjectRef {
            kind: ObjectKind::ClusterNetworkPolicy,
            key: self.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// Trims a ClusterNetworkPolicy to its name and spec (status and annotations such as
/// `kubectl.kubernetes.io/last-applied-configuration` are never read). A namespace, which
/// the API server never sets on a cluster-scoped object, is kept so the trimmed object
/// validates exactly as the original.
pub fn trim_cluster_network_policy(cnp: &mut ClusterNetworkPolicy) {
    let meta = std::mem::take(&mut cnp.metadata);
    cnp.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        ..ObjectMeta::default()
    };
}

impl Kind for StagedNetworkPolicy {
    const KIND: ObjectKind = ObjectKind::StagedNetworkPolicy;
    fn trim(&mut self) {
        let meta = std::mem::take(&mut self.metadata);
        self.metadata = ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            ..ObjectMeta::default()
        };
    }
    fn into_object(self) -> K8sObject {
        K8sObject::StagedNetworkPolicy(self)
    }
}

impl Kind for StagedClusterNetworkPolicy {
    const KIND: ObjectKind = ObjectKind::StagedClusterNetworkPolicy;
    fn trim(&mut self) {
        let meta = std::mem::take(&mut self.metadata);
        self.metadata = ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            ..ObjectMeta::default()
        };
    }
    fn into_object(self) -> K8sObject {
        K8sObject::StagedClusterNetworkPolicy(self)
    }
    fn datastore_ref(&self) -> ObjectRef {
        ObjectRef {
            kind: ObjectKind::StagedClusterNetworkPolicy,
            key: self.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// What a follower of an optional resource says when the resource is not served.
pub(super) struct Optional {
    pub api_version: &'static str,
    pub plural: &'static str,
    /// What is missing while the resource is not served, and what to install.
    pub consequence: &'static str,
}

pub(super) const CLUSTER_POLICIES: Optional = Optional {
    api_version: API_VERSION,
    plural: PLURAL,
    consequence:
        "ClusterNetworkPolicies are not enforced until network-policy-api's CRD is installed",
};

pub(super) const STAGED_POLICIES: Optional = Optional {
    api_version: staged::API_VERSION,
    plural: staged::PLURAL,
    consequence: "StagedNetworkPolicies are not evaluated until deploy/crds/ is installed",
};

pub(super) const STAGED_CLUSTER_POLICIES: Optional = Optional {
    api_version: staged::API_VERSION,
    plural: staged::CLUSTER_PLURAL,
    consequence: "StagedClusterNetworkPolicies are not evaluated until deploy/crds/ is installed",
};

/// Whether the resource is served, as far as we know.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Served {
    Unknown,
    Yes,
    No,
}

fn is_not_found(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::InitialListFailed(::kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(::kube::Error::Api(status))
        | watcher::Error::WatchFailed(::kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

/// Lists and watches an optional kind forever; see the module documentation. Returns only
/// when the receiver is gone.
pub(super) async fn follow<K: Kind>(
    api: Api<K>,
    options: &KubeOptions,
    mut lists: Lists,
    out: &Out,
    what: &Optional,
) -> Closed {
    let kind = K::KIND.as_str();
    let (api_version, plural) = (what.api_version, what.plural);
    let mut mirror = Mirror::<K>::default();
    let mut retry = Retry::new(options);
    let mut access = Access::default();
    let mut served = Served::Unknown;
    loop {
        let mut stream = watcher(api.clone(), lists.config(options))
            .modify(K::trim)
            .boxed();
        let mut restart = false;
        // A streaming list started (`Init`) and not ended, with no error since: a second
        // start means the server ignored `sendInitialEvents` (as for the other kinds).
        let mut streaming_list_open = false;
        while let Some(item) = stream.next().await {
            if item.is_err() {
                streaming_list_open = false;
            }
            let told = match &item {
                Ok(_) => access.after_event(K::KIND, out),
                Err(err) => access.after_error(K::KIND, err, out),
            };
            if let Err(closed) = told {
                return closed;
            }
            match item {
                Ok(event) => {
                    match &event {
                        watcher::Event::Init if lists.streaming() => {
                            if streaming_list_open && lists.ignored(kind) {
                                restart = true;
                                break;
                            }
                            streaming_list_open = true;
                        }
                        watcher::Event::InitDone => streaming_list_open = false,
                        _ => {}
                    }
                    if served != Served::Yes {
                        if served == Served::No {
                            info!(kind, "the {plural} resource is served now; following it");
                        }
                        served = Served::Yes;
                    }
                    if let Err(closed) = out.deliver(mirror.apply(event)) {
                        return closed;
                    }
                }
                Err(err) if lists.refused(kind, &err) => {
                    // The server refused a streaming list: `lists` fell back to pages.
                    restart = true;
                    break;
                }
                Err(err) if is_not_found(&err) => {
                    if served == Served::No {
                        debug!(kind, "the {plural} resource is still not served");
                    } else {
                        warn!(
                            kind,
                            recheck = ?options.missing_crd_recheck,
                            "the API server does not serve {api_version} {plural} (404): {}; \
                             looking again every {:?}",
                            what.consequence,
                            options.missing_crd_recheck
                        );
                    }
                    served = Served::No;
                    // An empty listing: what was delivered goes, and InSync may come.
                    let _ = mirror.apply(watcher::Event::Init);
                    if let Err(closed) = out.deliver(mirror.apply(watcher::Event::InitDone)) {
                        return closed;
                    }
                    tokio::time::sleep(options.missing_crd_recheck).await;
                    // A fresh watcher: list from scratch once the resource is back.
                    restart = true;
                    break;
                }
                Err(err) => {
                    let wait = retry.next_delay(super::is_expired(&err));
                    restart = wait_after_error(kind, &err, wait).await;
                    if restart {
                        break;
                    }
                }
            }
        }
        if !restart {
            // The watcher stream never ends by itself; if it ever does, start a new one.
            debug!(kind, "watch stream ended, restarting it");
            tokio::time::sleep(retry.next_delay(false)).await;
        }
    }
}
