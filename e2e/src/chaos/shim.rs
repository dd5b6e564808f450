//! Stand-ins for the restore tools, put first on the agent's `PATH`, that let the harness
//! stop the agent at an exact point of an `iptables-restore` or `ipset restore` and make the
//! tools fail or hang.
//!
//! Each stand-in is a small POSIX shell script that runs the real binary (`--test` probes,
//! `ipset save`/`list`, and every run nobody asked about go straight through). The harness
//! talks to it through files in a control directory, so no timing guesses are involved:
//! - `arm-<kind>` (one shot; the first run renames it away atomically, so exactly one run takes
//!   it): `before` holds before the real tool starts; `mid P` reads the agent's whole input,
//!   starts the real tool on a FIFO, feeds it the first P‰ of the lines (for `iptables-restore`
//!   that never includes `COMMIT`; for `ipset restore` some of the commands), and holds with
//!   the real tool still waiting for the rest; `after` runs the real tool to the end (the
//!   kernel has everything) and holds before the agent hears the exit status. A third field
//!   skips that many runs first. A run that takes the arm says so in `reached-<pid>`, then
//!   blocks until the harness kills the agent's process group (as the container runtime kills
//!   every process of a container whose main process died).
//! - `fail-<kind>` present: exit 1 with a message, without running the real tool.
//! - `hang-<kind>` present: wait until it is removed, then run the real tool (a tool stuck on
//!   something that later clears).
//!
//! `kind` is `iptables` (every `ip[6]tables-<backend>-restore`) or `ipset` (`ipset restore`).
//! The script is shell rather than a mode of this binary so that what it does is visible in
//! one screen and it starts in a millisecond.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cluster::Backend;
use netpol_agent::model::IpFamily;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Iptables,
    Ipset,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Iptables => "iptables",
            Kind::Ipset => "ipset",
        }
    }
}

/// Where a run of the tool stops (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    Before,
    /// Permille of the input lines fed to the real tool.
    Mid(u32),
    After,
}

impl Point {
    fn word(self) -> String {
        match self {
            Point::Before => "before 0".into(),
            Point::Mid(p) => format!("mid {p}"),
            Point::After => "after 0".into(),
        }
    }
}

pub struct Shims {
    pub bin: PathBuf,
    ctl: PathBuf,
}

const SCRIPT: &str = r#"#!/bin/sh
# netpol-e2e chaos stand-in for @REAL@ (e2e/src/chaos/shim.rs says what it does).
real='@REAL@'
ctl='@CTL@'
kind='@KIND@'
case " $* " in
  *" --test "*) exec "$real" "$@" ;;
esac
if [ "$kind" = ipset ]; then
  case " $* " in *" restore "*) ;; *) exec "$real" "$@" ;; esac
fi
if [ -e "$ctl/fail-$kind" ]; then
  echo "chaos: injected failure of $0" >&2
  exit 1
fi
while [ -e "$ctl/hang-$kind" ]; do sleep 0.05; done
hold() {
  echo "$1" > "$ctl/.reached-$$"
  mv "$ctl/.reached-$$" "$ctl/reached-$$"
  while :; do sleep 1; done
}
if mv "$ctl/arm-$kind" "$ctl/claimed-$$" 2>/dev/null; then
  read -r action permille skip < "$ctl/claimed-$$"
  rm -f "$ctl/claimed-$$"
  if [ "${skip:-0}" -gt 0 ]; then
    echo "$action $permille $((skip - 1))" > "$ctl/.arm-$$"
    mv "$ctl/.arm-$$" "$ctl/arm-$kind"
    exec "$real" "$@"
  fi
  case "$action" in
    before) hold "before $kind" ;;
    mid)
      input="$ctl/input-$$"
      cat > "$input"
      total=$(wc -l < "$input")
      keep=$((total * permille / 1000))
      mkfifo "$ctl/fifo-$$"
      "$real" "$@" < "$ctl/fifo-$$" &
      exec 3> "$ctl/fifo-$$"
      head -n "$keep" "$input" >&3
      sleep 0.05
      hold "mid $kind $keep/$total lines" ;;
    after)
      "$real" "$@"
      hold "after $kind (the real tool exited $?)" ;;
  esac
fi
exec "$real" "$@"
"#;

/// Where `program` is on the harness's `PATH`.
fn which(program: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} is not on PATH"))
}

impl Shims {
    /// Writes stand-ins for the restore tools of `backend` (both families) and `ipset` into
    /// `work/shims`, with their control directory `work/shim-ctl`.
    pub fn install(work: &Path, backend: Backend) -> anyhow::Result<Shims> {
        let bin = work.join("shims");
        let ctl = work.join("shim-ctl");
        std::fs::create_dir_all(&bin)?;
        std::fs::create_dir_all(&ctl)?;
        let mut tools = vec![("ipset".to_string(), Kind::Ipset)];
        for family in [IpFamily::V4, IpFamily::V6] {
            tools.push((backend.tool_for(family, "restore"), Kind::Iptables));
        }
        for (tool, kind) in tools {
            Shims::write(&bin, &ctl, &tool, &which(&tool)?, kind)?;
        }
        Ok(Shims { bin, ctl })
    }

    fn write(bin: &Path, ctl: &Path, tool: &str, real: &Path, kind: Kind) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let text = SCRIPT
            .replace("@REAL@", &real.display().to_string())
            .replace("@CTL@", &ctl.display().to_string())
            .replace("@KIND@", kind.name());
        let path = bin.join(tool);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// `PATH` for the agent: the stand-ins first.
    pub fn path_env(&self) -> String {
        let mut path = self.bin.display().to_string();
        if let Some(rest) = std::env::var_os("PATH") {
            let _ = write!(path, ":{}", rest.to_string_lossy());
        }
        path
    }

    /// The next run of `kind` (after `skip` others) stops at `point`.
    pub fn arm(&self, kind: Kind, point: Point, skip: u32) -> anyhow::Result<()> {
        let tmp = self.ctl.join(format!(".arm-{}", kind.name()));
        std::fs::write(&tmp, format!("{} {skip}\n", point.word()))?;
        std::fs::rename(&tmp, self.ctl.join(format!("arm-{}", kind.name())))?;
        Ok(())
    }

    /// Every run of `kind` fails (`on`), or no longer.
    pub fn fail(&self, kind: Kind, on: bool) -> anyhow::Result<()> {
        self.flag(&format!("fail-{}", kind.name()), on)
    }

    /// Every run of `kind` waits (`on`) until this is turned off.
    pub fn hang(&self, kind: Kind, on: bool) -> anyhow::Result<()> {
        self.flag(&format!("hang-{}", kind.name()), on)
    }

    fn flag(&self, name: &str, on: bool) -> anyhow::Result<()> {
        let path = self.ctl.join(name);
        if on {
            std::fs::write(path, "")?;
        } else if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Waits until an armed run says it stopped; its description.
    pub fn wait_reached(&self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(text) = self.reached() {
                return Some(text);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn reached(&self) -> Option<String> {
        let entries = std::fs::read_dir(&self.ctl).ok()?;
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("reached-") {
                return std::fs::read_to_string(e.path())
                    .ok()
                    .map(|t| t.trim().to_string());
            }
        }
        None
    }

    /// Back to pass-through: removes arms, flags, and what stopped runs left.
    pub fn reset(&self) -> anyhow::Result<()> {
        for e in std::fs::read_dir(&self.ctl)?.flatten() {
            std::fs::remove_file(e.path())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    /// A stand-in whose "real tool" copies its input to `out`, in a fresh directory.
    fn fixture(tag: &str) -> (PathBuf, Shims, PathBuf) {
        let dir = std::env::temp_dir().join(format!("npa-e2e-shim-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let real = dir.join("real");
        std::fs::write(&real, format!("#!/bin/sh\ncat > {}\n", out.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        let shims = Shims {
            bin: dir.join("bin"),
            ctl: dir.join("ctl"),
        };
        std::fs::create_dir_all(&shims.bin).unwrap();
        std::fs::create_dir_all(&shims.ctl).unwrap();
        Shims::write(&shims.bin, &shims.ctl, "tool", &real, Kind::Iptables).unwrap();
        (dir, shims, out)
    }

    fn spawn(shims: &Shims, input: &str) -> std::process::Child {
        let mut child = Command::new(shims.bin.join("tool"))
            .arg("--noflush")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let written = child.stdin.take().unwrap().write_all(input.as_bytes());
        // A stand-in told to fail exits without reading its input: a closed pipe is expected.
        if let Err(e) = written {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        }
        child
    }

    fn kill_group(child: &mut std::process::Child) {
        let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
    }

    const INPUT: &str = "*filter\n-A a\n-A b\n-A c\n-A d\n-A e\n-A f\n-A g\n-A h\nCOMMIT\n";

    #[test]
    fn passes_through_unless_told() {
        let (dir, shims, out) = fixture("pass");
        let child = spawn(&shims, INPUT);
        assert!(child.wait_with_output().unwrap().status.success());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), INPUT);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mid_feeds_a_prefix_and_holds_until_killed() {
        let (dir, shims, out) = fixture("mid");
        shims.arm(Kind::Iptables, Point::Mid(500), 0).unwrap();
        let mut child = spawn(&shims, INPUT);
        let said = shims.wait_reached(Duration::from_secs(5)).expect("reached");
        assert_eq!(said, "mid iptables 5/10 lines");
        std::thread::sleep(Duration::from_millis(50));
        assert!(child.try_wait().unwrap().is_none(), "it holds");
        kill_group(&mut child);
        // The real tool was killed mid-input: it saw the first half and never the COMMIT.
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "*filter\n-A a\n-A b\n-A c\n-A d\n"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn after_runs_the_tool_then_holds_and_skip_counts_runs() {
        let (dir, shims, out) = fixture("after");
        shims.arm(Kind::Iptables, Point::After, 1).unwrap();
        // The first run is skipped (passes through), the second stops.
        let first = spawn(&shims, "one\n");
        assert!(first.wait_with_output().unwrap().status.success());
        assert!(shims.reached().is_none());
        let mut second = spawn(&shims, INPUT);
        let said = shims.wait_reached(Duration::from_secs(5)).expect("reached");
        assert_eq!(said, "after iptables (the real tool exited 0)");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), INPUT);
        kill_group(&mut second);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn fail_and_hang() {
        let (dir, shims, out) = fixture("fail");
        shims.fail(Kind::Iptables, true).unwrap();
        let out1 = spawn(&shims, INPUT).wait_with_output().unwrap();
        assert_eq!(out1.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out1.stderr).contains("injected failure"));
        assert!(!out.exists());
        shims.fail(Kind::Iptables, false).unwrap();
        shims.hang(Kind::Iptables, true).unwrap();
        let mut child = spawn(&shims, INPUT);
        std::thread::sleep(Duration::from_millis(200));
        assert!(child.try_wait().unwrap().is_none(), "it hangs");
        shims.hang(Kind::Iptables, false).unwrap();
        assert!(child.wait().unwrap().success(), "and goes on once released");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), INPUT);
        shims.reset().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
