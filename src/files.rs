//! Reading files the host did not write alone (worker results, the state folder): only a
//! regular file is read, through no symbolic link, and at most a given size. A FIFO or a link to
//! `/dev/zero` would otherwise block the reader or fill its memory.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file")]
    NotRegular,
    #[error("{size} bytes, more than the {} MiB allowed", .max >> 20)]
    TooBig { size: u64, max: u64 },
}

impl ReadError {
    pub fn not_found(&self) -> bool {
        matches!(self, ReadError::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The bytes of the regular file at `path` (its last component no link), at most `max` of them.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > max {
        return Err(ReadError::TooBig {
            size: meta.len(),
            max,
        });
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        // It grew while read.
        return Err(ReadError::TooBig {
            size: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.json");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(read_regular(&file, 2).unwrap(), b"{}");
        assert!(matches!(
            read_regular(&file, 1),
            Err(ReadError::TooBig { size: 2, max: 1 })
        ));
        let link = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(
            read_regular(&link, 1 << 20).is_err(),
            "a link is not followed"
        );
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_regular(&fifo, 1 << 20),
            Err(ReadError::NotRegular)
        ));
        assert!(read_regular(&dir.path().join("none"), 1)
            .unwrap_err()
            .not_found());
    }
}
