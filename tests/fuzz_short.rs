//! The fuzz targets' short run in the test command (issue 16): `fuzz/src/` compiled into
//! this test, so it needs no build of its own (the fuzz package is its own workspace, whose
//! coverage-instrumented build `scripts/fuzz.sh` makes for the long run). What it runs and
//! why it is coverage-blind: `fuzz/src/short_run.rs`.

#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod fuzz;
