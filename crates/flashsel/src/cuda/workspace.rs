//! Workspace regions: how a plan lays out the scratch memory a launch needs.
//!
//! A caller hands every device call one workspace allocation (from torch's
//! allocator, say); a plan carves it into regions, each starting on a
//! [`ALIGN`]-byte boundary so that vector and atomic accesses are aligned
//! whatever the region before it holds. Pure arithmetic: planners use it
//! without a GPU.

/// Alignment of every region, bytes (and of the workspace pointer itself).
pub const ALIGN: u64 = 256;

/// Lays out regions one after another.
#[derive(Debug, Clone, Default)]
pub struct Regions {
    end: u64,
}

impl Regions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a region of `bytes` bytes and returns its offset.
    pub fn add(&mut self, bytes: u64) -> u64 {
        let at = self.end;
        self.end = (at + bytes).div_ceil(ALIGN) * ALIGN;
        at
    }

    /// Bytes of the workspace that holds every region added so far.
    pub fn total(&self) -> u64 {
        self.end
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn regions_are_aligned_and_disjoint() {
        let mut r = super::Regions::new();
        assert_eq!(r.total(), 0);
        assert_eq!(r.add(10), 0);
        assert_eq!(r.add(256), 256);
        assert_eq!(r.add(0), 512);
        assert_eq!(r.add(1), 512);
        assert_eq!(r.total(), 768);
    }
}
