//! The JSON-lines target of flow logs (`FELIX_FLOWLOGSFILEENABLED`, felix's names for the
//! directory, file count and size): every finished record, one JSON object a line (the
//! schema of `GET /flows`), appended to `<directory>/flows.log` (felix's file name) when its
//! interval is flushed.
//!
//! Guarantees: bounded on disk: before a write would take `flows.log` past the size limit it
//! is rotated (`flows.log` → `flows.log.1` → … → `flows.log.<max files - 1>`, the oldest
//! removed), so the files hold at most max files × size (plus one interval's lines should a
//! single flush be larger than the limit: a flush is never split). A write that fails is
//! counted (`netpol_flow_log_file_errors_total`) and logged when the target turns bad and
//! when it recovers, not once per flush; the next flush opens the file again. Records are
//! never held back for the file: what fails to be written is lost to the file only (the API
//! still has it).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// felix's file name.
pub const FILE_NAME: &str = "flows.log";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSettings {
    pub directory: PathBuf,
    /// Files kept, the one being written included (≥ 1).
    pub max_files: u32,
    /// Size one file grows to at most, in bytes (≥ 1).
    pub max_file_bytes: u64,
}

/// The open target.
pub struct FlowFile {
    settings: FileSettings,
    file: Option<File>,
    size: u64,
    failing: bool,
}

impl FlowFile {
    pub fn new(settings: FileSettings) -> FlowFile {
        FlowFile {
            settings,
            file: None,
            size: 0,
            failing: false,
        }
    }

    pub fn path(&self) -> PathBuf {
        self.settings.directory.join(FILE_NAME)
    }

    fn rotated(&self, n: u32) -> PathBuf {
        self.settings.directory.join(format!("{FILE_NAME}.{n}"))
    }

    /// Appends one flush's lines (each ending in a newline); on failure the error is counted
    /// and logged on the change from good to bad, and `Err` returned.
    pub fn write(&mut self, lines: &str) -> io::Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let result = self.try_write(lines);
        match &result {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(path = %self.path().display(), "flow-log file writable again");
            }
            Err(e) => {
                crate::telemetry::metrics::global()
                    .flow_log_file_errors
                    .inc();
                if !self.failing {
                    tracing::error!(path = %self.path().display(), error = %e,
                        "cannot write the flow-log file (FELIX_FLOWLOGSFILEDIRECTORY); records go to the API only until it works again");
                }
                self.failing = true;
                // Opened again at the next flush.
                self.file = None;
            }
            Ok(()) => {}
        }
        result
    }

    fn try_write(&mut self, lines: &str) -> io::Result<()> {
        let len = lines.len() as u64;
        if self.file.is_none() {
            self.open()?;
        }
        if self.size > 0 && self.size + len > self.settings.max_file_bytes {
            self.rotate()?;
        }
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("not open"))?;
        file.write_all(lines.as_bytes())?;
        self.size += len;
        Ok(())
    }

    fn open(&mut self) -> io::Result<()> {
        std::fs::create_dir_all(&self.settings.directory)?;
        let path = self.path();
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        self.size = file.metadata()?.len();
        self.file = Some(file);
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        let keep = self.settings.max_files.max(1);
        if keep == 1 {
            remove_if_there(&self.path())?;
        } else {
            remove_if_there(&self.rotated(keep - 1))?;
            for n in (1..keep - 1).rev() {
                rename_if_there(&self.rotated(n), &self.rotated(n + 1))?;
            }
            rename_if_there(&self.path(), &self.rotated(1))?;
        }
        self.open()
    }
}

fn remove_if_there(p: &Path) -> io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn rename_if_there(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("npa-flowfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn rotates_before_the_limit_and_keeps_max_files() {
        let d = dir("rotate");
        let mut f = FlowFile::new(FileSettings {
            directory: d.clone(),
            max_files: 3,
            max_file_bytes: 25,
        });
        for n in 0..6 {
            f.write(&format!("{{\"record\":{n:04}}}\n")).unwrap(); // 16 bytes a line
        }
        let read = |name: &str| std::fs::read_to_string(d.join(name)).ok();
        // One line per file (two would pass 25 bytes); three files, newest in flows.log.
        assert_eq!(read("flows.log").as_deref(), Some("{\"record\":0005}\n"));
        assert_eq!(read("flows.log.1").as_deref(), Some("{\"record\":0004}\n"));
        assert_eq!(read("flows.log.2").as_deref(), Some("{\"record\":0003}\n"));
        assert_eq!(read("flows.log.3"), None, "at most 3 files");
        // Reopening appends to what is there and counts its size.
        let mut again = FlowFile::new(FileSettings {
            directory: d.clone(),
            max_files: 1,
            max_file_bytes: 40,
        });
        again.write("{\"x\":1}\n").unwrap();
        assert_eq!(
            read("flows.log").as_deref(),
            Some("{\"record\":0005}\n{\"x\":1}\n")
        );
        again.write("{\"y\":22222222222222222222}\n").unwrap();
        assert_eq!(
            read("flows.log").as_deref(),
            Some("{\"y\":22222222222222222222}\n"),
            "one file kept: rotation removes the old one"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let d = dir("bad");
        std::fs::write(&d, "a file where the directory should be").unwrap();
        let mut f = FlowFile::new(FileSettings {
            directory: d.clone(),
            max_files: 2,
            max_file_bytes: 100,
        });
        assert!(f.write("{}\n").is_err());
        assert!(f.failing);
        std::fs::remove_file(&d).unwrap();
        assert!(f.write("{}\n").is_ok(), "recovers at the next write");
        assert!(!f.failing);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
