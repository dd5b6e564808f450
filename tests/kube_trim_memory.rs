//! How much heap a typical pod takes before and after the Kubernetes datastore trims it
//! (the figure quoted in `src/datastore/kube.rs`). Its own test binary, so that the counting
//! allocator sees no other test's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::api::core::v1::Pod;
use netpol_agent::datastore::kube::trim_pod;
use netpol_agent::model::validate;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::SeqCst);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes that `make` leaves allocated (what the value it returns holds).
fn held<T>(make: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::SeqCst);
    let value = make();
    let after = LIVE.load(Ordering::SeqCst);
    (value, (after - before) as usize)
}

#[test]
fn a_typical_pod_shrinks_several_fold_when_trimmed() {
    let text = include_str!("kube_api/typical_pod.json");
    let full: Pod = serde_json::from_str(text).expect("typical pod");
    // As the reflector store holds them: one boxed (Arc'd) value each.
    let (full_boxed, full_bytes) = held(|| Box::new(full.clone()));
    let mut trimmed = full.clone();
    trim_pod(&mut trimmed);
    let (trimmed_boxed, trimmed_bytes) = held(|| Box::new(trimmed.clone()));
    println!(
        "typical pod: {} bytes of JSON; {full_bytes} heap bytes as a Pod, {trimmed_bytes} trimmed \
         (size_of::<Pod>() = {})",
        text.len(),
        std::mem::size_of::<Pod>()
    );
    assert_eq!(
        validate::pod(&full_boxed),
        validate::pod(&trimmed_boxed),
        "the trimmed pod validates as the full one"
    );
    assert!(
        trimmed_bytes * 5 < full_bytes,
        "trimming should save most of the pod: {full_bytes} → {trimmed_bytes} bytes"
    );

    // Without named ports no container is kept at all.
    let mut portless = full.clone();
    for c in &mut portless.spec.as_mut().unwrap().containers {
        c.ports = None;
    }
    trim_pod(&mut portless);
    let (_, portless_bytes) = held(|| Box::new(portless.clone()));
    println!("the same pod without named ports: {portless_bytes} heap bytes trimmed");
    assert!(portless_bytes < 4096, "{portless_bytes}");
}
