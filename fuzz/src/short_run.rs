//! The short run of every target for the test command, in a plain test build: the root
//! package's `tests/fuzz_short.rs` compiles this crate's targets into a test (no dependency
//! of its own to build), and `cd fuzz && cargo test --lib` runs it too. First each target's
//! regression inputs
//! (`regressions/<target>/`, crashes found before), then a few seconds of random mutations of
//! its seeds (and of its local corpus, `corpus/<target>/`, when a long run left one).
//!
//! Why not libFuzzer here: its loop needs the coverage-instrumented release build of the
//! agent and its dependencies (`scripts/fuzz.sh`, about 8 minutes of a fresh 2-core CI
//! machine), more than the test command can spend. This run is coverage-blind — byte flips,
//! interesting bytes, inserted, deleted and repeated ranges, splices of two inputs, the
//! mutations libFuzzer starts from — so it finds what lies a few edits from a seed; the
//! coverage-guided search is the long run. Written by hand because no maintained crate
//! offers seed mutation without a fuzzing engine; `fastrand` draws the choices.
//!
//! `NPA_FUZZ_SHORT_SECS` sets the time per target (default 2), `NPA_FUZZ_SHORT_SEED` the
//! random seed (default 1, so a failure repeats). An input that fails a target's checks is
//! saved under `artifacts/<target>/` (as libFuzzer would) and named in the failure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{seeds::seeds, Target, TARGETS};

/// The long run's `-max_len`.
const MAX_LEN: usize = 65_536;
/// Bytes that end or start tokens in the formats the targets read.
const INTERESTING: &[u8] = b"\x00\xff\x7f\x80\n\r\t \"':-{}[],#*=/\\0129";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `fuzz/<sub>/<target>`, from either package.
fn dir(sub: &str, target: &str) -> PathBuf {
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fuzz = if package.join("fuzz/Cargo.toml").is_file() {
        package.join("fuzz")
    } else {
        package.to_path_buf()
    };
    fuzz.join(sub).join(target)
}

/// The files of a directory, or none when it does not exist.
fn files(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().is_file())
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

/// One to four mutations of `input`, `other` the partner of a splice.
fn mutate(rng: &mut fastrand::Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..rng.usize(1..=4) {
        let len = data.len();
        match rng.u8(0..6) {
            0 if len > 0 => {
                let at = rng.usize(0..len);
                data[at] ^= 1 << rng.u8(0..8);
            }
            1 if len > 0 => {
                let at = rng.usize(0..len);
                data[at] = INTERESTING[rng.usize(0..INTERESTING.len())];
            }
            2 if len > 0 => {
                let at = rng.usize(0..len);
                let end = (at + rng.usize(1..=16)).min(len);
                data.drain(at..end);
            }
            3 => {
                let at = rng.usize(0..=len);
                let bytes: Vec<u8> = (0..rng.usize(1..=8)).map(|_| rng.u8(..)).collect();
                data.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let at = rng.usize(0..len);
                let end = (at + rng.usize(1..=64)).min(len);
                let piece = data[at..end].to_vec();
                let to = rng.usize(0..=len);
                data.splice(to..to, piece);
            }
            _ if !other.is_empty() => {
                let cut = rng.usize(0..=len);
                let from = rng.usize(0..other.len());
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    data.truncate(MAX_LEN);
    data
}

/// Runs `target` on `data`; the panic message when it failed.
fn run(target: Target, data: &[u8]) -> Option<String> {
    catch_unwind(AssertUnwindSafe(|| target(data)))
        .err()
        .map(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into())
        })
}

/// Saves a failing input like libFuzzer does; its path.
fn save_crash(name: &str, data: &[u8]) -> PathBuf {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    data.hash(&mut h);
    let dir = dir("artifacts", name);
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("crash-short-{:016x}", h.finish()));
    let _ = std::fs::write(&path, data);
    path
}

#[test]
fn every_target_survives_its_regressions_and_a_short_mutation_run() {
    let per_target = Duration::from_secs_f64(env_or("NPA_FUZZ_SHORT_SECS", 2.0));
    let mut rng = fastrand::Rng::with_seed(env_or("NPA_FUZZ_SHORT_SEED", 1));
    let mut failures = Vec::new();
    for (name, target) in TARGETS {
        for data in files(&dir("regressions", name)) {
            if let Some(why) = run(target, &data) {
                failures.push(format!("{name}: a regression input fails again: {why}"));
            }
        }
        let mut pool = seeds(name);
        pool.extend(files(&dir("corpus", name)));
        assert!(!pool.is_empty(), "{name} has no seeds");
        let started = Instant::now();
        let mut executions = 0u64;
        let mut crashes = 0;
        while started.elapsed() < per_target && crashes < 3 {
            let input = &pool[rng.usize(0..pool.len())];
            let other = &pool[rng.usize(0..pool.len())];
            let data = mutate(&mut rng, input, other);
            executions += 1;
            if let Some(why) = run(target, &data) {
                crashes += 1;
                let path = save_crash(name, &data);
                failures.push(format!("{name}: {why} (input saved: {})", path.display()));
            }
        }
        eprintln!(
            "short run {name:<14} {executions:>8} executions in {:.1} s, {crashes} crashes",
            started.elapsed().as_secs_f64()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn mutations_change_inputs_and_stay_within_the_length_limit() {
    let mut rng = fastrand::Rng::with_seed(7);
    let seed = b"-A cali-FORWARD -j ACCEPT\n".to_vec();
    let mut changed = 0;
    for _ in 0..1000 {
        let m = mutate(&mut rng, &seed, b"COMMIT\n");
        assert!(m.len() <= MAX_LEN);
        changed += usize::from(m != seed);
    }
    assert!(
        changed > 900,
        "only {changed} of 1000 mutations changed the input"
    );
    let long = vec![b'x'; MAX_LEN];
    assert!((0..100).all(|_| mutate(&mut rng, &long, &long).len() <= MAX_LEN));
    // A failing target is caught and its message kept.
    let why = run(|d| assert!(d.is_empty(), "not empty: {}", d.len()), b"ab");
    assert_eq!(why.as_deref(), Some("not empty: 2"));
    assert_eq!(run(|_| {}, b""), None);
}
