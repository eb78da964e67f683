//! What a reader receives for one exported block, as bytes (the array's layout travels beside
//! it). Read back from untrusted bytes: a wrong length or tag is refused.

use crate::error::{Error, Result};

const TAG: &[u8; 4] = b"CBI2";
const LEN: usize = 4 + 4 + 8 + 4 + 4 + 16 + 8 + 8 + 64 + 1 + 64;

/// One exported block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wire {
    /// The exporting process.
    pub pid: u32,
    /// A value the exporting process drew once (a reused pid is another process).
    pub nonce: u64,
    /// The exporter's counter segment, as its file descriptor number there.
    pub counters_fd: i32,
    /// This receipt's slot in that segment.
    pub slot: u32,
    /// The device's UUID (ordinals differ between processes).
    pub uuid: [u8; 16],
    /// The block's size in bytes.
    pub size: u64,
    /// The block's address in the exporting process (a receipt there uses it as it is).
    pub base: u64,
    /// `CUmemPoolPtrExportData`.
    pub pointer: [u8; 64],
    /// The interprocess event's handle; `None` where the block's last write was complete.
    pub event: Option<[u8; 64]>,
}

impl Wire {
    /// The bytes that [`Wire::from_bytes`] reads.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEN);
        out.extend_from_slice(TAG);
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.nonce.to_le_bytes());
        out.extend_from_slice(&self.counters_fd.to_le_bytes());
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(&self.pointer);
        out.push(self.event.is_some() as u8);
        out.extend_from_slice(&self.event.unwrap_or([0; 64]));
        out
    }

    /// Reads what [`Wire::to_bytes`] wrote.
    pub fn from_bytes(bytes: &[u8]) -> Result<Wire> {
        if bytes.len() != LEN || &bytes[..4] != TAG {
            return Err(Error::invalid(
                "not a shared cubridge array (made by another version of cubridge?)",
            ));
        }
        let mut at = 4;
        let mut take = |n: usize| {
            at += n;
            &bytes[at - n..at]
        };
        let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or_default());
        let pid = u32_of(take(4));
        let nonce = u64::from_le_bytes(take(8).try_into().unwrap_or_default());
        let counters_fd = u32_of(take(4)) as i32;
        let slot = u32_of(take(4));
        let uuid = take(16).try_into().unwrap_or_default();
        let size = u64::from_le_bytes(take(8).try_into().unwrap_or_default());
        let base = u64::from_le_bytes(take(8).try_into().unwrap_or_default());
        let pointer = take(64).try_into().unwrap_or([0; 64]);
        let event = match take(1)[0] {
            0 => None,
            1 => Some(take(64).try_into().unwrap_or([0; 64])),
            _ => {
                return Err(Error::invalid(
                    "not a shared cubridge array (a malformed event)",
                ))
            }
        };
        Ok(Wire {
            pid,
            nonce,
            counters_fd,
            slot,
            uuid,
            size,
            base,
            pointer,
            event,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_reads_back_and_refuses_other_bytes() {
        let w = Wire {
            pid: 7,
            nonce: u64::MAX - 3,
            counters_fd: 11,
            slot: 4095,
            uuid: [5; 16],
            size: 1 << 40,
            base: 0x7f00_0000_0000,
            pointer: [9; 64],
            event: Some([1; 64]),
        };
        let bytes = w.to_bytes();
        assert_eq!(Wire::from_bytes(&bytes).unwrap(), w);
        let none = Wire {
            event: None,
            ..w.clone()
        };
        assert_eq!(Wire::from_bytes(&none.to_bytes()).unwrap(), none);
        let mut flag = none.to_bytes();
        flag[LEN - 65] = 2;
        assert!(Wire::from_bytes(&flag).is_err());
        assert!(Wire::from_bytes(&bytes[1..]).is_err());
        let mut other = bytes.clone();
        other[0] = b'X';
        assert!(Wire::from_bytes(&other).is_err());
    }
}
