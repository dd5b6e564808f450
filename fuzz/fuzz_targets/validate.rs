#![no_main]
//! See `netpol_agent_fuzz::validate` for what this target feeds and checks.

libfuzzer_sys::fuzz_target!(
    init: netpol_agent_fuzz::seeds::write_if_asked("validate"),
    |data: &[u8]| netpol_agent_fuzz::validate(data)
);
