//! Giving freed heap back to the kernel. The agent's big allocations are transient: the
//! initial listing decodes every object of the cluster (pages of 500 full pods, or one object
//! at a time when streaming), the first flush renders every chain and set, the first apply
//! builds restore scripts of tens of thousands of lines. glibc keeps what is freed in its
//! per-thread arenas for reuse, and several threads (datastore, calculation, dataplane) each
//! grow their own, so without help the resident size at rest stays near the peak of the
//! start. `release_free_memory` asks glibc (`malloc_trim`) to return every free page of every
//! arena; it is called once the first full apply is done. It costs a walk of the heap
//! (milliseconds) and changes no allocation. Hand-written: the one call `libc` exposes, no
//! crate wraps it.
//!
//! The `netpol-agent` binary allocates with mimalloc (`main.rs`), which returns free pages by
//! itself; the trim then covers what glibc still serves (C code, and this library used from
//! another binary, as the tests do).

/// Returns free heap pages to the kernel (glibc); elsewhere it does nothing. Returns whether
/// any memory was released.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas; any pad is valid.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// This process's resident set size in KiB (`VmRSS`), 0 where it cannot be read.
pub fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_goes_back_to_the_kernel() {
        let rss_kib = resident_kib;
        // Many small blocks (below the mmap threshold), all touched, every other one kept so
        // that the heap cannot simply shrink from its top.
        let mut blocks: Vec<Vec<u8>> = (0..100_000).map(|i| vec![i as u8; 1000]).collect();
        let kept: Vec<Vec<u8>> = blocks.iter().step_by(64).cloned().collect();
        blocks.clear();
        blocks.shrink_to_fit();
        let before = rss_kib();
        release_free_memory();
        let after = rss_kib();
        assert!(kept.len() > 1500);
        assert!(
            after + 40_000 < before,
            "RSS {before} KiB before the trim, {after} KiB after"
        );
    }
}
