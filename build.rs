//! The git commit the binary is built from, for `--version` and the start-up log
//! (`NETPOL_GIT_COMMIT`): `git rev-parse` when the source is a git checkout, else what the
//! environment says (an image build without `.git` passes it as a build argument), else
//! "unknown".

use std::process::Command;

fn main() {
    let commit = std::env::var("NETPOL_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NETPOL_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-env-changed=NETPOL_GIT_COMMIT");
    // Read again when HEAD moves to another branch or commit it names directly. Not on every
    // commit to the branch: a new value rebuilds the whole crate, so an incremental build in a
    // working tree may carry the commit of its last clean build; release builds (CI, the
    // image) start clean and carry their own.
    if std::path::Path::new(".git/HEAD").exists() {
        println!("cargo:rerun-if-changed=.git/HEAD");
    }
}
