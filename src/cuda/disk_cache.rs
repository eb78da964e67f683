//! The disk cache of compiled kernels, so that a new process does not run NVRTC again. It lives
//! in `$CUBRIDGE_CACHE_DIR`, else `$XDG_CACHE_HOME/cubridge`, else `~/.cache/cubridge`.
//!
//! An entry is one file per program, architecture and NVRTC version
//! (`KEY.nvrtcMAJOR.MINOR.ARCH.bin`): a header that repeats what it was made for and the image's
//! length and checksum, then the image (a cubin, or NUL-terminated PTX). Nothing reaches the
//! driver unchecked: an entry that is truncated, padded, zeroed, empty, made for another
//! program, architecture or NVRTC, or whose checksum fails is discarded (with one warning per
//! process) and the program compiled again. Writers put a whole entry in a file of their own and
//! rename it into place, so processes that compile the same kernel at once never see each
//! other's partial files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What an entry starts with.
const MAGIC: &[u8; 8] = b"CBKERNEL";
/// The layout of the header below; bumped when it changes.
const FORMAT: u32 = 1;
/// Magic, format, arch, NVRTC major and minor, key (16 hex digits), image length, checksum.
const HEADER: usize = 8 + 4 + 4 + 4 + 4 + 16 + 8 + 8;

/// What an entry is made for: the program's key ([`super::nvrtc::key`]), the device
/// architecture, and the NVRTC version that compiled it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The program's key: 16 hex digits.
    pub key: String,
    /// Compute capability as a number (90 for 9.0).
    pub arch: u32,
    /// NVRTC's (major, minor) version.
    pub nvrtc: (i32, i32),
}

fn dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CUBRIDGE_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("cubridge"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("cubridge"))
}

impl Entry {
    fn file_name(&self) -> String {
        let (major, minor) = self.nvrtc;
        format!("{}.nvrtc{major}.{minor}.{}.bin", self.key, self.arch)
    }

    fn path(&self) -> Option<PathBuf> {
        dir().map(|d| d.join(self.file_name()))
    }

    /// The header of this entry over `image`.
    fn header(&self, image: &[u8]) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            h[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(MAGIC);
        put(&FORMAT.to_le_bytes());
        put(&self.arch.to_le_bytes());
        put(&self.nvrtc.0.to_le_bytes());
        put(&self.nvrtc.1.to_le_bytes());
        let mut key = [b'0'; 16];
        let k = self.key.as_bytes();
        key[..k.len().min(16)].copy_from_slice(&k[..k.len().min(16)]);
        put(&key);
        put(&(image.len() as u64).to_le_bytes());
        put(&checksum(image).to_le_bytes());
        h
    }

    /// The image in `file` if it is a whole, intact entry made for this one, else why not.
    pub fn check<'f>(&self, file: &'f [u8]) -> Result<&'f [u8], &'static str> {
        if file.len() < HEADER {
            return Err(if file.is_empty() {
                "empty"
            } else {
                "shorter than its header"
            });
        }
        let (head, image) = file.split_at(HEADER);
        if &head[..8] != MAGIC {
            return Err("not a cubridge kernel entry");
        }
        if head != self.header(image) {
            // The length and checksum are the header's last 16 bytes.
            return Err(
                if head[..HEADER - 16] != self.header(image)[..HEADER - 16] {
                    "made for another program, architecture or NVRTC"
                } else if head[HEADER - 16..HEADER - 8] != (image.len() as u64).to_le_bytes() {
                    "truncated or padded"
                } else {
                    "its checksum does not match"
                },
            );
        }
        if image.is_empty() {
            return Err("empty image");
        }
        Ok(image)
    }

    /// The cached image, if there is an intact one; a damaged entry is discarded on the way
    /// (see the module documentation).
    pub fn read(&self) -> Option<Vec<u8>> {
        let path = self.path()?;
        let file = std::fs::read(&path).ok()?;
        match self.check(&file) {
            Ok(image) => Some(image.to_vec()),
            Err(why) => {
                discard(&path, why);
                None
            }
        }
    }

    /// Whether a file for this entry exists (intact or not: [`Entry::read`] checks).
    pub fn exists(&self) -> bool {
        self.path().is_some_and(|p| p.is_file())
    }

    /// Keeps `image` for later processes. Best effort: a cache that cannot be written only costs
    /// a later compile.
    pub fn write(&self, image: &[u8]) {
        let Some(path) = self.path() else { return };
        let Some(dir) = path.parent() else { return };
        let _ = std::fs::create_dir_all(dir);
        // A name no other writer uses: this process, and a count within it.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            "{}.{}.{}.tmp",
            self.file_name(),
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&self.header(image))?;
            f.write_all(image)
        });
        if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Removes this entry: its image was intact but the driver refused it (`why`).
    pub fn discard(&self, why: &str) {
        if let Some(path) = self.path() {
            discard(&path, why);
        }
    }
}

/// The newest-NVRTC entry for `key` and `arch` when the NVRTC version is unknown (NVRTC is not
/// installed, so nothing can be compiled: a cached image is then the only one, and the driver
/// still checks it), as its NVRTC version.
pub fn any_version(key: &str, arch: u32) -> Option<(i32, i32)> {
    let (prefix, suffix) = (format!("{key}.nvrtc"), format!(".{arch}.bin"));
    std::fs::read_dir(dir()?)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let version = name.strip_prefix(&prefix)?.strip_suffix(&suffix)?;
            let (major, minor) = version.split_once('.')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .max()
}

/// What the cache keeps of a module: its `image` alone when it has no name expressions, else
/// the image, the lowered names (each followed by a NUL) and their byte count (8 bytes, little
/// endian), so that a later process maps name expressions without NVRTC.
pub fn with_names(image: &[u8], lowered: &[String]) -> Vec<u8> {
    let mut payload = image.to_vec();
    if lowered.is_empty() {
        return payload;
    }
    let start = payload.len();
    for name in lowered {
        payload.extend_from_slice(name.as_bytes());
        payload.push(0);
    }
    let len = (payload.len() - start) as u64;
    payload.extend_from_slice(&len.to_le_bytes());
    payload
}

/// The image and the `n` lowered names of a payload made by [`with_names`], or `None` when it
/// does not hold exactly `n` names.
pub fn split_names(payload: &[u8], n: usize) -> Option<(&[u8], Vec<String>)> {
    if n == 0 {
        return Some((payload, Vec::new()));
    }
    let (rest, len) = payload.split_at_checked(payload.len().checked_sub(8)?)?;
    let len = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
    let (image, names) = rest.split_at_checked(rest.len().checked_sub(len)?)?;
    let names = names.strip_suffix(&[0])?;
    let names: Vec<String> = names
        .split(|&b| b == 0)
        .map(|b| String::from_utf8(b.to_vec()).ok())
        .collect::<Option<_>>()?;
    (names.len() == n && !image.is_empty()).then_some((image, names))
}

/// Deletes a damaged entry, saying so once per process.
fn discard(path: &Path, why: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let _ = std::fs::remove_file(path);
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "cubridge: discarded the damaged kernel cache entry {} ({why}); compiling it again",
            path.display()
        );
    }
}

/// A 64-bit FNV-1a hash of `bytes`, a word at a time (a checksum against damage, not an
/// adversary).
fn checksum(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for w in words.by_ref() {
        let word = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        hash = (hash ^ word).wrapping_mul(0x0100_0000_01b3);
    }
    for &b in words.remainder() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            key: "0123456789abcdef".into(),
            arch: 90,
            nvrtc: (12, 9),
        }
    }

    fn file(entry: &Entry, image: &[u8]) -> Vec<u8> {
        let mut f = entry.header(image).to_vec();
        f.extend_from_slice(image);
        f
    }

    #[test]
    fn an_intact_entry_gives_its_image_and_damage_is_named() {
        let image: Vec<u8> = (0..1000u32).map(|x| (x * 7) as u8).collect();
        let e = entry();
        let good = file(&e, &image);
        assert_eq!(e.check(&good), Ok(&image[..]));

        assert_eq!(e.check(&[]), Err("empty"));
        assert_eq!(e.check(&good[..HEADER - 1]), Err("shorter than its header"));
        assert_eq!(e.check(&good[..good.len() - 1]), Err("truncated or padded"));
        let mut padded = good.clone();
        padded.push(0);
        assert_eq!(e.check(&padded), Err("truncated or padded"));
        assert_eq!(
            e.check(&vec![0u8; good.len()]),
            Err("not a cubridge kernel entry")
        );
        let mut flipped = good.clone();
        flipped[HEADER + 500] ^= 1;
        assert_eq!(e.check(&flipped), Err("its checksum does not match"));
        // An intact entry of another architecture, NVRTC or program, renamed into place.
        for other in [
            Entry {
                arch: 80,
                ..entry()
            },
            Entry {
                nvrtc: (13, 0),
                ..entry()
            },
            Entry {
                key: "fedcba9876543210".into(),
                ..entry()
            },
        ] {
            assert_eq!(
                e.check(&file(&other, &image)),
                Err("made for another program, architecture or NVRTC")
            );
        }
        assert_eq!(e.check(&file(&e, &[])), Err("empty image"));
    }

    #[test]
    fn lowered_names_travel_after_the_image() {
        let image = b"\x7fELF image bytes".to_vec();
        let names = vec!["_Z3addIfEvPT_".to_string(), "_Z5tableILi3EE".to_string()];
        let payload = with_names(&image, &names);
        assert_eq!(split_names(&payload, 2), Some((&image[..], names.clone())));
        assert_eq!(with_names(&image, &[]), image);
        assert_eq!(split_names(&image, 0), Some((&image[..], vec![])));
        // Another number of names, a damaged length, or too short a payload: not this module's.
        assert_eq!(split_names(&payload, 1), None);
        assert_eq!(split_names(&payload[..payload.len() - 1], 2), None);
        assert_eq!(split_names(&[1, 2, 3], 1), None);
        let mut long = payload.clone();
        let at = long.len() - 8;
        long[at..].copy_from_slice(&(payload.len() as u64 * 2).to_le_bytes());
        assert_eq!(split_names(&long, 2), None);
    }

    #[test]
    fn entries_of_other_nvrtc_versions_have_other_names() {
        let other = Entry {
            nvrtc: (13, 0),
            ..entry()
        };
        assert_ne!(entry().file_name(), other.file_name());
        assert_eq!(entry().file_name(), "0123456789abcdef.nvrtc12.9.90.bin");
    }
}
