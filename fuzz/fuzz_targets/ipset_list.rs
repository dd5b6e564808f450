#![no_main]
//! See `netpol_agent_fuzz::ipset_list` for what this target feeds and checks.

libfuzzer_sys::fuzz_target!(
    init: netpol_agent_fuzz::seeds::write_if_asked("ipset_list"),
    |data: &[u8]| netpol_agent_fuzz::ipset_list(data)
);
