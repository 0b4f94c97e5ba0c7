//! The threshold test of the hot loop: which elements of a tile may beat the
//! current threshold, as bit masks, with the widest SIMD the CPU has.
//!
//! Every implementation computes exactly [`beats`] for every element (proved
//! against it in the unit tests below on every available level); the engine's
//! answer never depends on which one ran.

use std::any::TypeId;

use half::{bf16, f16};

use crate::contract::{DType, NanPolicy, ScoreElem};

use super::key::KeyFn;

/// Elements compared with the threshold into one `u64` mask.
pub(crate) const BLOCK: usize = 64;

/// Blocks whose masks are taken in one branch-free sweep before any candidate
/// is visited.
pub(crate) const TILE_BLOCKS: usize = 64;

/// Elements per tile (16 KiB of f32: still in L1 when the candidates are read).
pub(crate) const TILE: usize = BLOCK * TILE_BLOCKS;

/// The filter threshold in the forms the block test uses.
///
/// For the built-in types the test `key(x) > t` is done without computing keys:
/// `v` is the float whose key is `t` (`+0.0` for the zero key) and, for a
/// non-NaN `x`, `key(x) > t` iff `x > v` as floats (the key is the float order
/// with `-0.0 == +0.0`). NaN then passes iff its key beats `t`: never under
/// `Lowest` (`x > v` is false for NaN), always under `Largest` (`!(x <= v)` is
/// true for NaN). `f16` compares order-preserving 16-bit integers instead of
/// floats (no cheap widening without F16C), with NaN handled by mask. Two keys
/// have no float: the NaN key itself (`0` under `Lowest`: every non-NaN passes,
/// so the block test is skipped, `all`) and keys no element can beat (`none`:
/// the scan stops).
///
/// `t` must be an attained key (the key of some element, or what
/// [`KeyFn::below`] returns).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thr {
    pub t: u32,
    /// The float with key `t` (f32, bf16).
    pub v: f32,
    /// The order-preserving integer of the f16 with key `t`.
    pub s: i16,
    pub all: bool,
    pub none: bool,
}

/// `b` (f16 or bf16 bits) as an integer whose signed order is the float order,
/// `-0.0` just below `+0.0`, positive NaNs above `+inf`, negative NaNs below `-inf`.
#[inline(always)]
pub(crate) fn ordered16(b: u16) -> i16 {
    (b ^ ((((b as i16) >> 15) as u16) >> 1)) as i16
}

impl Thr {
    pub(crate) fn new<T: ScoreElem>(t: u32, kf: &KeyFn) -> Self {
        let (all, none) = (kf.is_fast() && kf.nan() == NanPolicy::Lowest && t == 0, t >= kf.max_key());
        // Bits of the float with key `t` (the contract's key inverted; `-0.0`
        // never comes out: the zero key gives `+0.0`).
        let sign = if T::DTYPE == DType::F32 { 0x8000_0000u32 } else { 0x8000 };
        let bits = if t >= sign { t ^ sign } else { !t & (sign | (sign - 1)) };
        let v = match T::DTYPE {
            DType::F32 => f32::from_bits(bits),
            DType::BF16 => f32::from_bits(bits << 16),
            // f16 compares `s`, not a float.
            _ => 0.0,
        };
        Self { t, v, s: ordered16(bits as u16), all, none }
    }
}

/// Whether `x` may beat the threshold: exactly `key(x) > t` (not meaningful
/// when `th.all` or `th.none`: the caller tests nothing then).
#[inline(always)]
pub(crate) fn beats<T: ScoreElem, const FAST: bool, const LARGEST: bool>(kf: &KeyFn, th: &Thr, x: T) -> bool {
    if !FAST {
        return kf.exact(x) > th.t;
    }
    match T::DTYPE {
        DType::F32 | DType::BF16 => {
            let b = x.bits();
            let f = f32::from_bits(if T::DTYPE == DType::F32 { b } else { b << 16 });
            // Under `Largest` NaN beats every non-NaN threshold.
            if LARGEST {
                f > th.v || f.is_nan()
            } else {
                f > th.v
            }
        }
        // f16 (the only other score type).
        _ => {
            let b = x.bits() as u16;
            let gt = ordered16(b) > th.s;
            let nan = (b & 0x7fff) > 0x7c00;
            if LARGEST {
                gt | nan
            } else {
                gt & !nan
            }
        }
    }
}

/// The instruction sets the mask can be computed with, weakest first.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Simd {
    /// Plain Rust, one element at a time.
    Portable,
    /// 128-bit (the x86-64 baseline).
    Sse2,
    /// 256-bit, detected at run time.
    Avx2,
    /// 512-bit with byte/word ops (`avx512f` + `avx512bw`), detected at run time.
    Avx512,
}

impl Simd {
    /// The widest level this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                return Simd::Avx512;
            }
            if is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
            #[cfg(target_feature = "sse2")]
            return Simd::Sse2;
        }
        #[allow(unreachable_code)]
        Simd::Portable
    }

    /// `self`, lowered to what this CPU runs.
    pub fn available(self) -> Self {
        self.min(Self::detect())
    }
}

/// Fills `masks[b]` with the mask of block `b` of `tile` (`TILE` elements): bit
/// `j` set iff `beats(tile[BLOCK b + j])`. `simd` must be available (see
/// [`Simd::available`]); it is ignored unless `FAST` (the built-in types).
#[inline(always)]
pub(crate) fn tile_masks<T: ScoreElem, const FAST: bool, const LARGEST: bool>(
    simd: Simd,
    kf: &KeyFn,
    th: &Thr,
    tile: &[T],
    masks: &mut [u64; TILE_BLOCKS],
) {
    let tile: &[T; TILE] = tile.try_into().expect("a whole tile");
    if FAST {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        match simd {
            // SAFETY (all three): `simd` is available on this CPU (the caller
            // lowered it with `Simd::available`), which is all these need;
            // SSE2 is part of this build's target.
            Simd::Avx512 => return unsafe { x86::masks_avx512::<T, LARGEST>(th, tile, masks) },
            Simd::Avx2 => return unsafe { x86::masks_avx2::<T, LARGEST>(th, tile, masks) },
            Simd::Sse2 => return unsafe { x86::masks_sse2::<T, LARGEST>(th, tile, masks) },
            Simd::Portable => {}
        }
    }
    let _ = simd;
    for (m, block) in masks.iter_mut().zip(tile.chunks_exact(BLOCK)) {
        let mut mask = 0u64;
        for (j, &x) in block.iter().enumerate() {
            mask |= (beats::<T, FAST, LARGEST>(kf, th, x) as u64) << j;
        }
        *m = mask;
    }
}

/// Which built-in type `T` is, by `TypeId` (what makes the raw loads below
/// sound: a `[T; N]` of one of these is `N` plain values of its size).
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Builtin {
    F32,
    Bf16,
    F16,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn builtin<T: 'static>() -> Option<Builtin> {
    let id = TypeId::of::<T>();
    if id == TypeId::of::<f32>() {
        Some(Builtin::F32)
    } else if id == TypeId::of::<bf16>() {
        Some(Builtin::Bf16)
    } else if id == TypeId::of::<f16>() {
        Some(Builtin::F16)
    } else {
        None
    }
}

/// The x86 masks. Each function handles one tile; loads are unaligned and stay
/// inside the `[T; TILE]` they are given, whose element type is checked by
/// `TypeId` first. f32 and bf16 (widened exactly by a 16-bit shift) compare as
/// floats with `_CMP_GT_OQ` (`x > v`, false on NaN) under `Lowest` and
/// `_CMP_NLE_UQ` (`!(x <= v)`, true on NaN) under `Largest`; f16 compares
/// [`ordered16`] integers and masks NaN (`|x| > 0x7c00`) in or out.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{builtin, Builtin, Thr, BLOCK, TILE, TILE_BLOCKS};
    use crate::contract::ScoreElem;

    #[target_feature(enable = "sse2")]
    pub(super) fn masks_sse2<T: ScoreElem, const LARGEST: bool>(
        th: &Thr,
        tile: &[T; TILE],
        masks: &mut [u64; TILE_BLOCKS],
    ) {
        let ty = builtin::<T>().expect("SIMD masks are for the built-in types");
        let v = _mm_set1_ps(th.v);
        let cmp = |x: __m128| if LARGEST { _mm_cmpnle_ps(x, v) } else { _mm_cmpgt_ps(x, v) };
        let s = _mm_set1_epi16(th.s);
        let mag = _mm_set1_epi16(0x7fff);
        let inf = _mm_set1_epi16(0x7c00);
        let zero = _mm_setzero_si128();
        let base = tile.as_ptr();
        for (b, m) in masks.iter_mut().enumerate() {
            let mut mask = 0u64;
            match ty {
                Builtin::F32 => {
                    for i in 0..BLOCK / 4 {
                        // SAFETY: `T` is f32; elements `BLOCK b + 4 i .. + 4` are
                        // inside the tile.
                        let x = unsafe { _mm_loadu_ps((base as *const f32).add(BLOCK * b + 4 * i)) };
                        mask |= (_mm_movemask_ps(cmp(x)) as u32 as u64) << (4 * i);
                    }
                }
                Builtin::Bf16 => {
                    for i in 0..BLOCK / 8 {
                        // SAFETY: `T` is bf16 (2 bytes); elements
                        // `BLOCK b + 8 i .. + 8` are inside the tile.
                        let x =
                            unsafe { _mm_loadu_si128((base as *const u16).add(BLOCK * b + 8 * i) as *const __m128i) };
                        let lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, x));
                        let hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, x));
                        let bits = _mm_movemask_ps(cmp(lo)) as u32 | (_mm_movemask_ps(cmp(hi)) as u32) << 4;
                        mask |= (bits as u64) << (8 * i);
                    }
                }
                Builtin::F16 => {
                    let lanes = |i: usize| {
                        // SAFETY: `T` is f16 (2 bytes); elements
                        // `BLOCK b + 8 i .. + 8` are inside the tile.
                        let x =
                            unsafe { _mm_loadu_si128((base as *const u16).add(BLOCK * b + 8 * i) as *const __m128i) };
                        let o = _mm_xor_si128(x, _mm_srli_epi16::<1>(_mm_srai_epi16::<15>(x)));
                        let gt = _mm_cmpgt_epi16(o, s);
                        let nan = _mm_cmpgt_epi16(_mm_and_si128(x, mag), inf);
                        if LARGEST {
                            _mm_or_si128(gt, nan)
                        } else {
                            _mm_andnot_si128(nan, gt)
                        }
                    };
                    for i in 0..BLOCK / 16 {
                        let packed = _mm_packs_epi16(lanes(2 * i), lanes(2 * i + 1));
                        mask |= (_mm_movemask_epi8(packed) as u32 as u64) << (16 * i);
                    }
                }
            }
            *m = mask;
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn masks_avx2<T: ScoreElem, const LARGEST: bool>(
        th: &Thr,
        tile: &[T; TILE],
        masks: &mut [u64; TILE_BLOCKS],
    ) {
        let ty = builtin::<T>().expect("SIMD masks are for the built-in types");
        let v = _mm256_set1_ps(th.v);
        let cmp = |x: __m256| {
            if LARGEST {
                _mm256_cmp_ps::<_CMP_NLE_UQ>(x, v)
            } else {
                _mm256_cmp_ps::<_CMP_GT_OQ>(x, v)
            }
        };
        let s = _mm256_set1_epi16(th.s);
        let mag = _mm256_set1_epi16(0x7fff);
        let inf = _mm256_set1_epi16(0x7c00);
        let base = tile.as_ptr();
        for (b, m) in masks.iter_mut().enumerate() {
            let mut mask = 0u64;
            match ty {
                Builtin::F32 => {
                    for i in 0..BLOCK / 8 {
                        // SAFETY: `T` is f32; elements `BLOCK b + 8 i .. + 8` are
                        // inside the tile.
                        let x = unsafe { _mm256_loadu_ps((base as *const f32).add(BLOCK * b + 8 * i)) };
                        mask |= (_mm256_movemask_ps(cmp(x)) as u32 as u64) << (8 * i);
                    }
                }
                Builtin::Bf16 => {
                    for i in 0..BLOCK / 8 {
                        // SAFETY: `T` is bf16 (2 bytes); elements
                        // `BLOCK b + 8 i .. + 8` are inside the tile.
                        let x =
                            unsafe { _mm_loadu_si128((base as *const u16).add(BLOCK * b + 8 * i) as *const __m128i) };
                        let f = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x)));
                        mask |= (_mm256_movemask_ps(cmp(f)) as u32 as u64) << (8 * i);
                    }
                }
                Builtin::F16 => {
                    let lanes = |i: usize| {
                        // SAFETY: `T` is f16 (2 bytes); elements
                        // `BLOCK b + 16 i .. + 16` are inside the tile.
                        let x = unsafe {
                            _mm256_loadu_si256((base as *const u16).add(BLOCK * b + 16 * i) as *const __m256i)
                        };
                        let o = _mm256_xor_si256(x, _mm256_srli_epi16::<1>(_mm256_srai_epi16::<15>(x)));
                        let gt = _mm256_cmpgt_epi16(o, s);
                        let nan = _mm256_cmpgt_epi16(_mm256_and_si256(x, mag), inf);
                        if LARGEST {
                            _mm256_or_si256(gt, nan)
                        } else {
                            _mm256_andnot_si256(nan, gt)
                        }
                    };
                    for i in 0..BLOCK / 32 {
                        // packs works per 128-bit half: [a.lo, b.lo, a.hi, b.hi];
                        // the permute restores element order.
                        let packed = _mm256_packs_epi16(lanes(2 * i), lanes(2 * i + 1));
                        let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
                        mask |= (_mm256_movemask_epi8(ordered) as u32 as u64) << (32 * i);
                    }
                }
            }
            *m = mask;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn masks_avx512<T: ScoreElem, const LARGEST: bool>(
        th: &Thr,
        tile: &[T; TILE],
        masks: &mut [u64; TILE_BLOCKS],
    ) {
        let ty = builtin::<T>().expect("SIMD masks are for the built-in types");
        let v = _mm512_set1_ps(th.v);
        let cmp = |x: __m512| {
            if LARGEST {
                _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(x, v)
            } else {
                _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, v)
            }
        };
        let s = _mm512_set1_epi16(th.s);
        let mag = _mm512_set1_epi16(0x7fff);
        let inf = _mm512_set1_epi16(0x7c00);
        let base = tile.as_ptr();
        for (b, m) in masks.iter_mut().enumerate() {
            let mut mask = 0u64;
            match ty {
                Builtin::F32 => {
                    for i in 0..BLOCK / 16 {
                        // SAFETY: `T` is f32; elements `BLOCK b + 16 i .. + 16`
                        // are inside the tile.
                        let x = unsafe { _mm512_loadu_ps((base as *const f32).add(BLOCK * b + 16 * i)) };
                        mask |= (cmp(x) as u64) << (16 * i);
                    }
                }
                Builtin::Bf16 => {
                    for i in 0..BLOCK / 16 {
                        // SAFETY: `T` is bf16 (2 bytes); elements
                        // `BLOCK b + 16 i .. + 16` are inside the tile.
                        let x = unsafe {
                            _mm256_loadu_si256((base as *const u16).add(BLOCK * b + 16 * i) as *const __m256i)
                        };
                        let f = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x)));
                        mask |= (cmp(f) as u64) << (16 * i);
                    }
                }
                Builtin::F16 => {
                    for i in 0..BLOCK / 32 {
                        // SAFETY: `T` is f16 (2 bytes); elements
                        // `BLOCK b + 32 i .. + 32` are inside the tile.
                        let x = unsafe {
                            _mm512_loadu_si512((base as *const u16).add(BLOCK * b + 32 * i) as *const __m512i)
                        };
                        let o = _mm512_xor_si512(x, _mm512_srli_epi16::<1>(_mm512_srai_epi16::<15>(x)));
                        let gt = _mm512_cmpgt_epi16_mask(o, s);
                        let nan = _mm512_cmpgt_epi16_mask(_mm512_and_si512(x, mag), inf);
                        let bits = if LARGEST { gt | nan } else { gt & !nan };
                        mask |= (bits as u64) << (32 * i);
                    }
                }
            }
            *m = mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::data::splitmix64 as rng;

    /// Every level on this CPU gives the masks of `beats`, and `beats` is
    /// `key > t`, for random tiles salted with specials, at thresholds taken from
    /// the tile itself (every kind of key, NaN and zeros included).
    fn check<T: ScoreElem>(from_bits: impl Fn(u32) -> T, width: u32) {
        let levels: Vec<Simd> = [Simd::Portable, Simd::Sse2, Simd::Avx2, Simd::Avx512]
            .into_iter()
            .filter(|l| l.available() == *l)
            .collect();
        let mut st = 7u64;
        let specials: Vec<u32> = if width == 32 {
            vec![0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0xffc0_0001, 0x7f80_0001, 1, 0x8000_0001]
        } else {
            vec![0, 0x8000, 0x7f80, 0xff80, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x7f81, 1, 0x8001]
        };
        for round in 0..40 {
            let tile: Vec<T> = (0..TILE)
                .map(|i| {
                    let r = rng(&mut st);
                    let bits = match (round + i) % 4 {
                        0 => specials[(r % specials.len() as u64) as usize],
                        1 => (r as u32) & 0x8000_03ff, // small magnitudes, both signs
                        _ => r as u32,
                    };
                    from_bits(if width == 32 { bits } else { bits & 0xffff })
                })
                .collect();
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                let kf = KeyFn::for_type::<T>(nan);
                for probe in 0..8 {
                    let t = tile[(rng(&mut st) as usize + probe) % TILE].key(nan);
                    let th = Thr::new::<T>(t, &kf);
                    if th.all || th.none {
                        continue;
                    }
                    let want: Vec<u64> = tile
                        .chunks_exact(BLOCK)
                        .map(|b| b.iter().enumerate().fold(0u64, |m, (j, x)| m | ((x.key(nan) > t) as u64) << j))
                        .collect();
                    for &level in &levels {
                        let mut got = [0u64; TILE_BLOCKS];
                        match nan {
                            NanPolicy::Lowest => tile_masks::<T, true, false>(level, &kf, &th, &tile, &mut got),
                            NanPolicy::Largest => tile_masks::<T, true, true>(level, &kf, &th, &tile, &mut got),
                        }
                        assert_eq!(&got[..], &want[..], "{:?} {level:?} {nan:?} t={t:#x}", T::DTYPE);
                    }
                }
            }
        }
    }

    #[test]
    fn masks_equal_key_comparison_on_every_level() {
        check::<f32>(f32::from_bits, 32);
        check::<bf16>(|b| bf16::from_bits(b as u16), 16);
        check::<f16>(|b| f16::from_bits(b as u16), 16);
    }
}
