//! The counts of exported blocks that readers still hold: one segment of shared memory per
//! exporting process (a memfd), two words per slot: the count, and the reader's pid. Readers
//! open the segment through `/proc/<pid>/fd/<fd>` (no descriptor passing) and map it once.

use super::Wire;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Slots per process: blocks sent and not yet let go by their readers.
const SLOTS: usize = 4096;
const BYTES: usize = SLOTS * 16;

/// This process's segment.
struct Own {
    fd: i32,
    words: &'static [AtomicU64],
    spare: Vec<usize>,
    next: usize,
}

static OWN: Mutex<Option<Own>> = Mutex::new(None);

/// Maps `BYTES` of `fd` shared, for the process's lifetime.
fn map(fd: i32) -> Result<&'static [AtomicU64]> {
    // SAFETY: maps a file of at least BYTES bytes (checked by the callers); the mapping is
    // never unmapped, so the slice lives for the process.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::invalid(format!(
            "could not map the counters of shared arrays: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: page-aligned, BYTES long, zero-filled or written only through atomics.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), 2 * SLOTS) })
}

fn create() -> Result<Own> {
    let failed = |what: &str| {
        Error::invalid(format!(
            "could not {what} the counters of shared arrays: {}",
            std::io::Error::last_os_error()
        ))
    };
    // SAFETY: a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"cubridge-ipc".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(failed("create"));
    }
    // SAFETY: a file descriptor of ours.
    if unsafe { libc::ftruncate(fd, BYTES as libc::off_t) } != 0 {
        // SAFETY: closed once, on failure.
        unsafe { libc::close(fd) };
        return Err(failed("size"));
    }
    Ok(Own {
        fd,
        words: map(fd)?,
        spare: Vec::new(),
        next: 0,
    })
}

fn with_own<T>(f: impl FnOnce(&mut Own) -> Result<T>) -> Result<T> {
    let mut own = crate::lock(&OWN);
    if own.is_none() {
        *own = Some(create()?);
    }
    match own.as_mut() {
        Some(own) => f(own),
        None => Err(Error::invalid("the counters of shared arrays are missing")),
    }
}

/// This process's segment's file descriptor.
pub fn own_fd() -> Result<i32> {
    with_own(|own| Ok(own.fd))
}

/// A slot for one receipt, its count one (the reader's), no reader pid yet.
pub fn take_slot() -> Result<usize> {
    with_own(|own| {
        let slot = match own.spare.pop() {
            Some(slot) => slot,
            None if own.next < SLOTS => {
                own.next += 1;
                own.next - 1
            }
            None => {
                return Err(Error::invalid(format!(
                    "{SLOTS} arrays sent to other processes are still held there: let some go"
                )))
            }
        };
        own.words[2 * slot + 1].store(0, Ordering::Release);
        own.words[2 * slot].store(1, Ordering::Release);
        Ok(slot)
    })
}

/// Whether the reader of `slot` let go of the block, or died holding it (the driver then
/// released its mapping with its context).
pub fn released(slot: usize) -> bool {
    let own = crate::lock(&OWN);
    let Some(own) = own.as_ref() else {
        return true;
    };
    if own.words[2 * slot].load(Ordering::Acquire) == 0 {
        return true;
    }
    let pid = own.words[2 * slot + 1].load(Ordering::Acquire);
    pid != 0 && !alive(pid as libc::pid_t)
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Returns a slot whose block was let go.
pub fn give_back(slot: usize) {
    if let Some(own) = crate::lock(&OWN).as_mut() {
        own.spare.push(slot);
    }
}

/// The count of `wire`'s slot in its exporter's segment, with this process recorded as its
/// reader. Each exporter's segment is mapped once.
pub fn remote(wire: &Wire) -> Result<&'static AtomicU64> {
    static MAPPED: Mutex<Option<HashMap<u64, &'static [AtomicU64]>>> = Mutex::new(None);
    let slot = wire.slot as usize;
    if slot >= SLOTS {
        return Err(Error::invalid(
            "a shared array's counter slot is out of range",
        ));
    }
    let mut mapped = crate::lock(&MAPPED);
    let segments = mapped.get_or_insert_with(HashMap::new);
    let words = match segments.get(&wire.nonce) {
        Some(words) => *words,
        None => {
            let path = format!("/proc/{}/fd/{}", wire.pid, wire.counters_fd);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| {
                    Error::invalid(format!(
                        "could not open the sending process's counters ({path}): {e}; was it \
                         still running?"
                    ))
                })?;
            if file.metadata().map_or(0, |m| m.len()) < BYTES as u64 {
                return Err(Error::invalid(format!(
                    "{path} is not a cubridge counter segment"
                )));
            }
            use std::os::fd::AsRawFd;
            let words = map(file.as_raw_fd())?;
            segments.insert(wire.nonce, words);
            words
        }
    };
    words[2 * slot + 1].store(std::process::id() as u64, Ordering::Release);
    Ok(&words[2 * slot])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(slot: usize) -> Wire {
        Wire {
            pid: std::process::id(),
            nonce: 1,
            counters_fd: own_fd().unwrap(),
            slot: slot as u32,
            uuid: [0; 16],
            size: 0,
            base: 0,
            pointer: [0; 64],
            event: None,
        }
    }

    #[test]
    fn a_slot_is_held_until_its_reader_lets_go_or_dies() {
        let slot = take_slot().unwrap();
        assert!(!released(slot), "counted before any reader took it");
        // A reader maps the segment through /proc, as another process would.
        let count = remote(&wire(slot)).unwrap();
        assert_eq!(count.load(Ordering::Acquire), 1);
        assert!(!released(slot), "this process, the reader, is alive");
        count.fetch_sub(1, Ordering::AcqRel);
        assert!(released(slot));
        give_back(slot);

        let slot = take_slot().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        remote(&wire(slot)).unwrap();
        crate::lock(&OWN).as_ref().unwrap().words[2 * slot + 1]
            .store(dead as u64, Ordering::Release);
        assert!(released(slot), "a reader that died holds nothing");
        give_back(slot);
        assert!(remote(&wire(SLOTS)).is_err());
    }
}
