//! The two text formats the kernel's tools speak, read in one place: `iptables-save` output
//! and `iptables-restore` input ([`iptables_save`]), `ipset save` output and `ipset restore`
//! input ([`ipset_save`]). Each line is classified once here; every consumer (the table writer, the set
//! writer, the owned-state reading behind `audit` and convergence checks, the verdict's kernel
//! interpreter, `inspect`, the felix detector) builds its own model from the classified lines
//! and none splits a line itself.
//!
//! Pure and imports nothing of ours. What is "ours" in a table or among the sets is the
//! consumer's business: the readers here know no prefix, hash or set name.
//!
//! Written by hand rather than with a crate: no maintained crate reads either format, and
//! the formats are line-oriented with a handful of line kinds (iptables: `*table`, `:chain`,
//! `-A`/`-I`, `COMMIT`; ipset: `create`, `add`), so a splitter per line is all they need.

pub mod ipset_save;
pub mod iptables_save;
