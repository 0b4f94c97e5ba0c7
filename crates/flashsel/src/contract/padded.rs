//! The padded index list: how every operation returns a variable number of
//! indices per row in a fixed-width `i32` row.
//!
//! A row of width `w` holds its `n <= w` valid indices first, then `-1` up to
//! `w` ([`PAD`]). Valid indices are never negative, so the count of a row is
//! the position of its first `-1`; no valid index follows a `-1`.
//! Value outputs beside an index list pad with `-inf`.

/// The index written where a row has no more entries.
pub const PAD: i32 = -1;

/// The number of valid entries of a padded row (the position of its first
/// [`PAD`], or the width).
pub fn valid_len(row: &[i32]) -> usize {
    row.iter().position(|&i| i == PAD).unwrap_or(row.len())
}

/// Whether `row` is well formed: valid entries (`0..bound`) first, then only
/// [`PAD`].
pub fn is_well_formed(row: &[i32], bound: usize) -> bool {
    let n = valid_len(row);
    row[..n].iter().all(|&i| i >= 0 && (i as usize) < bound) && row[n..].iter().all(|&i| i == PAD)
}

#[cfg(test)]
mod tests {
    #[test]
    fn valid_len_and_form() {
        assert_eq!(super::valid_len(&[3, 1, -1, -1]), 2);
        assert_eq!(super::valid_len(&[3, 1]), 2);
        assert_eq!(super::valid_len(&[-1, -1]), 0);
        assert!(super::is_well_formed(&[3, 1, -1], 4));
        assert!(!super::is_well_formed(&[3, -1, 1], 4));
        assert!(!super::is_well_formed(&[4, -1], 4));
        assert!(!super::is_well_formed(&[-2, -1], 4));
    }
}
