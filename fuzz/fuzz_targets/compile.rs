#![no_main]
//! See `netpol_agent_fuzz::compile` for what this target feeds and checks.

libfuzzer_sys::fuzz_target!(
    init: netpol_agent_fuzz::seeds::write_if_asked("compile"),
    |data: &[u8]| netpol_agent_fuzz::compile(data)
);
