//! `[gpu] share = "vram"`: when holders may hold the GPU at the same time. Exclusive (the
//! default) grants a service or lease only to an empty GPU. With `vram`, a request whose memory
//! is known is also granted beside others when every holder's footprint, the loaded residents'
//! footprints and its own fit in `memory_total − headroom_mib`, and the memory is free now.
//! A request of unknown size, or one beside a holder of unknown size, still waits for an empty
//! GPU; one alone is always granted (it then makes room as in exclusive mode).

use serde::{Deserialize, Serialize};

/// How grants share the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ShareMode {
    /// Services and leases hold the GPU alone.
    #[default]
    Exclusive,
    /// Holders whose footprints fit together share it.
    Vram,
}

/// The policy the queue applies.
#[derive(Debug, Clone, Copy)]
pub struct Sharing {
    pub mode: ShareMode,
    pub headroom_mib: u64,
    /// Let a later request that fits go ahead of a head that does not (otherwise strict FIFO).
    pub allow_backfill: bool,
}

impl Default for Sharing {
    fn default() -> Self {
        Sharing {
            mode: ShareMode::Exclusive,
            headroom_mib: 1024,
            allow_backfill: false,
        }
    }
}

/// The device as the arbiter sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub total_mib: u64,
    pub free_mib: u64,
    /// Footprints of the resident workers that are loaded (or loading).
    pub residents_mib: u64,
    /// Footprints of the resident workers that are unloaded (a speech job brings them back).
    pub unloaded_residents_mib: u64,
}

/// Something that tells the queue the current `Room` (`None` without a GPU sample).
pub struct RoomSource(pub Box<dyn Fn() -> Option<Room> + Send + Sync>);

impl std::fmt::Debug for RoomSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoomSource")
    }
}

/// Whether a request needing `need_mib` fits beside holders that reserved `holders_mib` (`None`
/// when any holder's size is unknown).
pub fn fits(
    sharing: &Sharing,
    room: Option<Room>,
    holders_mib: Option<u64>,
    need_mib: Option<u64>,
) -> bool {
    if sharing.mode != ShareMode::Vram {
        return false;
    }
    let (Some(room), Some(holders), Some(need)) = (room, holders_mib, need_mib) else {
        return false;
    };
    let capacity = room.total_mib.saturating_sub(sharing.headroom_mib);
    // Sizes come from requests (a lease's `vram_mib`): added without wrapping around.
    holders
        .saturating_add(room.residents_mib)
        .saturating_add(need)
        <= capacity
        && room.free_mib >= need.saturating_add(sharing.headroom_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOM: Room = Room {
        total_mib: 32_000,
        free_mib: 12_000,
        residents_mib: 18_000,
        unloaded_residents_mib: 0,
    };

    #[test]
    fn packs_what_fits_and_nothing_else() {
        let vram = Sharing {
            mode: ShareMode::Vram,
            ..Sharing::default()
        };
        // 18 000 resident + 4 000 + 1 024 headroom ≤ 32 000, and 12 000 free ≥ 5 024.
        assert!(fits(&vram, Some(ROOM), Some(0), Some(4_000)));
        // A second 4 000 beside the first still fits; a 9 000 does not.
        assert!(fits(&vram, Some(ROOM), Some(4_000), Some(4_000)));
        assert!(!fits(&vram, Some(ROOM), Some(4_000), Some(9_000)));
        // Unknown sizes, no sample, or exclusive mode: never shared.
        assert!(!fits(&vram, Some(ROOM), None, Some(1)));
        assert!(!fits(&vram, Some(ROOM), Some(0), None));
        assert!(!fits(&vram, None, Some(0), Some(1)));
        assert!(!fits(&Sharing::default(), Some(ROOM), Some(0), Some(1)));
        // Memory used by someone outside counts: little free, no grant.
        let busy = Room {
            free_mib: 3_000,
            ..ROOM
        };
        assert!(!fits(&vram, Some(busy), Some(0), Some(4_000)));
        // A lease asking for u64::MAX MiB beside one that did: no wrap-around into "fits".
        assert!(!fits(&vram, Some(ROOM), Some(u64::MAX), Some(u64::MAX)));
        assert!(!fits(&vram, Some(ROOM), Some(u64::MAX - 17_000), Some(1)));
    }
}
