//! Branch-free order keys for the hot loop.
//!
//! [`ScoreElem::key`] (the contract) is written with early returns for NaN and
//! zero; that is clear but gives the compiler branches in the scan loop. The
//! functions here compute the same `u32` with masks and selects only, so a block
//! of keys vectorises. The unit tests below prove equality with
//! [`ScoreElem::key`] on every `bf16` and `f16` bit pattern and on a dense sweep
//! of `f32` patterns, under both NaN policies.
//!
//! Only the three built-in element types take this path ([`KeyFn::for_type`]);
//! any other implementor of [`ScoreElem`] is keyed through its own
//! [`ScoreElem::key`], so the engine never assumes more than the trait says.

use std::any::TypeId;

use half::{bf16, f16};

use crate::contract::{DType, NanPolicy, ScoreElem};

/// The bit fields of a sign-magnitude float of 16 or 32 bits, widened to `u32`.
#[derive(Debug, Clone, Copy)]
struct Fields {
    sign: u32,
    exp: u32,
    man: u32,
}

#[inline(always)]
const fn fields(dtype: DType) -> Fields {
    match dtype {
        DType::F32 => Fields { sign: 0x8000_0000, exp: 0x7f80_0000, man: 0x007f_ffff },
        DType::BF16 => Fields { sign: 0x8000, exp: 0x7f80, man: 0x007f },
        DType::F16 => Fields { sign: 0x8000, exp: 0x7c00, man: 0x03ff },
        // Scores are f32, bf16 or f16 (SelectSpec::validate); fp8 is storage only.
        _ => panic!("no score key for a storage-only dtype"),
    }
}

/// The contract key of raw bits `bits` of a `dtype` float, branch-free.
///
/// * positive or `+0.0`, `-0.0`: `bits | sign` (so `-0.0`, whose bits are
///   exactly `sign`, lands on the key of `+0.0`);
/// * negative non-zero (`bits > sign`): `bits ^ all`, i.e. `!bits & all`;
/// * NaN (`magnitude > exp`): `nan_key` (`0` or `all`).
#[inline(always)]
pub(crate) fn key_of_bits(bits: u32, dtype: DType, nan_key: u32) -> u32 {
    let Fields { sign, exp, man } = fields(dtype);
    let all = sign | exp | man;
    let neg = 0u32.wrapping_sub((bits > sign) as u32);
    let k = (bits | sign) ^ (neg & all);
    let is_nan = (bits & (exp | man)) > exp;
    if is_nan {
        nan_key
    } else {
        k
    }
}

/// The key NaN takes under `nan` for `dtype`.
#[inline]
pub(crate) fn nan_key(dtype: DType, nan: NanPolicy) -> u32 {
    let Fields { sign, exp, man } = fields(dtype);
    match nan {
        NanPolicy::Lowest => 0,
        NanPolicy::Largest => sign | exp | man,
    }
}

/// How the engine keys elements of type `T`: the branch-free bit formula for the
/// built-in types, the trait's own [`ScoreElem::key`] otherwise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyFn {
    nan: NanPolicy,
    nan_key: u32,
    pos_inf_key: u32,
    dtype: DType,
    fast: bool,
}

impl KeyFn {
    pub(crate) fn for_type<T: ScoreElem>(nan: NanPolicy) -> Self {
        let id = TypeId::of::<T>();
        let builtin = (id == TypeId::of::<f32>() && T::DTYPE == DType::F32)
            || (id == TypeId::of::<bf16>() && T::DTYPE == DType::BF16)
            || (id == TypeId::of::<f16>() && T::DTYPE == DType::F16);
        let Fields { sign, exp, .. } = fields(T::DTYPE);
        Self { nan, nan_key: nan_key(T::DTYPE, nan), pos_inf_key: sign | exp, dtype: T::DTYPE, fast: builtin }
    }

    /// The NaN policy.
    #[inline(always)]
    pub(crate) fn nan(&self) -> NanPolicy {
        self.nan
    }

    /// A key no element can beat: that of NaN under `Largest`, of `+inf` under
    /// `Lowest` (built-in types); `u32::MAX` for other types.
    #[inline]
    pub(crate) fn max_key(&self) -> u32 {
        match (self.fast, self.nan) {
            (false, _) => u32::MAX,
            (true, NanPolicy::Largest) => self.nan_key,
            (true, NanPolicy::Lowest) => self.pos_inf_key,
        }
    }

    /// The largest key an element can have that is below `t` (an attained key),
    /// or `None` when no element ranks below `t`. So `key(x) >= t` iff
    /// `key(x) > below(t)`, and the result is again an attained key.
    ///
    /// Attained keys of the built-in types are consecutive except for two gaps:
    /// the key of `-0.0`'s raw pattern (`sign - 1`, mapped onto `+0.0`'s) and,
    /// under `Lowest`, the keys of negative NaN patterns (`1 ..= key(-inf) - 1`,
    /// all NaN maps to `0`). Under `Largest`, NaN (`all`) sits right above `+inf`.
    pub(crate) fn below(&self, t: u32) -> Option<u32> {
        if !self.fast {
            return t.checked_sub(1);
        }
        let Fields { sign, exp, man } = fields(self.dtype);
        let neg_inf = man; // !(sign | exp) & all
        match self.nan {
            NanPolicy::Lowest if t == 0 => None,
            NanPolicy::Lowest if t == neg_inf => Some(0),
            NanPolicy::Largest if t == neg_inf => None,
            NanPolicy::Largest if t == self.nan_key => Some(sign | exp),
            _ if t == sign => Some(sign - 2),
            _ => Some(t - 1),
        }
    }

    /// Whether the branch-free formula is used.
    #[inline(always)]
    pub(crate) fn is_fast(&self) -> bool {
        self.fast
    }

    /// The contract key of `x` (branch-free path; only valid when
    /// [`Self::is_fast`]).
    #[inline(always)]
    pub(crate) fn fast<T: ScoreElem>(&self, x: T) -> u32 {
        key_of_bits(x.bits(), T::DTYPE, self.nan_key)
    }

    /// The contract key of `x` through the trait.
    #[inline(always)]
    pub(crate) fn exact<T: ScoreElem>(&self, x: T) -> u32 {
        x.key(self.nan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICIES: [NanPolicy; 2] = [NanPolicy::Lowest, NanPolicy::Largest];

    /// `key_of_bits` against the trait's key for every 16-bit pattern.
    fn every_pattern<T: ScoreElem>(dtype: DType, from_bits: impl Fn(u16) -> T) {
        for nan in POLICIES {
            let nk = nan_key(dtype, nan);
            for b in 0..=u16::MAX {
                assert_eq!(key_of_bits(b as u32, dtype, nk), from_bits(b).key(nan), "{dtype:?} {b:#06x} {nan:?}");
            }
        }
    }

    #[test]
    fn bf16_every_pattern() {
        every_pattern(DType::BF16, bf16::from_bits);
    }

    #[test]
    fn f16_every_pattern() {
        every_pattern(DType::F16, f16::from_bits);
    }

    /// `below` against brute force over every attained half key.
    #[test]
    fn below_is_the_previous_attained_key() {
        fn check<T: ScoreElem>(from_bits: impl Fn(u16) -> T) {
            for nan in POLICIES {
                let kf = KeyFn::for_type::<T>(nan);
                assert!(kf.is_fast());
                let mut keys: Vec<u32> = (0..=u16::MAX).map(|b| from_bits(b).key(nan)).collect();
                keys.sort_unstable();
                keys.dedup();
                assert_eq!(kf.below(keys[0]), None, "{nan:?}");
                for w in keys.windows(2) {
                    assert_eq!(kf.below(w[1]), Some(w[0]), "{:?} {nan:?} key {:#x}", T::DTYPE, w[1]);
                }
            }
        }
        check(bf16::from_bits);
        check(f16::from_bits);
        let f = |x: f32, nan| x.key(nan);
        for nan in POLICIES {
            let kf = KeyFn::for_type::<f32>(nan);
            let prev = |x: f32| kf.below(f(x, nan));
            assert_eq!(prev(0.0), Some(f(-f32::from_bits(1), nan)));
            assert_eq!(prev(-0.0), Some(f(-f32::from_bits(1), nan)));
            assert_eq!(prev(f32::from_bits(1)), Some(f(0.0, nan)));
            assert_eq!(prev(1.0), Some(f(f32::from_bits(0x3f7f_ffff), nan)));
            assert_eq!(prev(-1.0), Some(f(f32::from_bits(0xbf80_0001), nan)));
            assert_eq!(prev(f32::INFINITY), Some(f(f32::MAX, nan)));
            assert_eq!(prev(f32::MIN), Some(f(f32::NEG_INFINITY, nan)));
        }
        let lo = KeyFn::for_type::<f32>(NanPolicy::Lowest);
        assert_eq!(lo.below(f32::NEG_INFINITY.key(NanPolicy::Lowest)), Some(0));
        assert_eq!(lo.below(f32::NAN.key(NanPolicy::Lowest)), None);
        let hi = KeyFn::for_type::<f32>(NanPolicy::Largest);
        assert_eq!(hi.below(f32::NEG_INFINITY.key(NanPolicy::Largest)), None);
        assert_eq!(hi.below(f32::NAN.key(NanPolicy::Largest)), Some(f32::INFINITY.key(NanPolicy::Largest)));
    }

    fn check_f32(b: u32) {
        for nan in POLICIES {
            let nk = nan_key(DType::F32, nan);
            let x = f32::from_bits(b);
            assert_eq!(key_of_bits(b, DType::F32, nk), x.key(nan), "f32 {b:#010x} {nan:?}");
        }
    }

    #[test]
    fn f32_boundaries_and_sweep() {
        // Every pattern within 4096 of each field boundary, both signs.
        let edges =
            [0u32, 1, 0x007f_ffff, 0x0080_0000, 0x3f80_0000, 0x7f7f_ffff, 0x7f80_0000, 0x7f80_0001, 0x7fc0_0000];
        for &e in &edges {
            for s in [0u32, 0x8000_0000] {
                for d in 0..4096u32 {
                    check_f32(s | (e.wrapping_add(d) & 0x7fff_ffff));
                    check_f32(s | (e.wrapping_sub(d) & 0x7fff_ffff));
                }
            }
        }
        check_f32(u32::MAX);
        check_f32(0x8000_0000);
        // A dense stride through all 2^32 patterns (a prime stride hits every
        // exponent and a spread of mantissas), plus a pseudo-random sample.
        let mut b = 0u32;
        for _ in 0..(1u32 << 18) {
            check_f32(b);
            b = b.wrapping_add(16_381);
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..(1u32 << 18) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            check_f32(s as u32);
        }
    }
}
