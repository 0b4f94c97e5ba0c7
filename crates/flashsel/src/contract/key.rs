//! Scores to ordered keys, and the composite that makes the order total.

use half::{bf16, f16};

use super::error::{Error, Result};

/// Where NaN ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NanPolicy {
    /// NaN ranks below `-inf` (never selected while anything else is left).
    #[default]
    Lowest,
    /// NaN ranks above `+inf`, as `torch.topk` does.
    Largest,
}

impl NanPolicy {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "lowest" => Ok(Self::Lowest),
            "largest" => Ok(Self::Largest),
            _ => Err(Error::InvalidOption { what: "nan policy", value: s.into(), expected: "lowest|largest" }),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Lowest => "lowest",
            Self::Largest => "largest",
        }
    }
}

/// Element types of the tensors the operations read.
///
/// `F32`, `BF16` and `F16` are score types (they implement [`ScoreElem`]);
/// `F8E4M3` (OCP fp8, 4 exponent bits, 3 mantissa bits, no infinities) is a
/// storage type for indexer keys: no operation ranks fp8 scores, and one that
/// does not take a dtype says so ([`Error::UnknownDType`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DType {
    F32,
    BF16,
    F16,
    F8E4M3,
}

impl DType {
    /// Parses `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16`, `f8e4m3`/`float8_e4m3fn`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            "f16" | "float16" => Ok(Self::F16),
            "f8e4m3" | "float8_e4m3fn" => Ok(Self::F8E4M3),
            _ => Err(Error::UnknownDType(format!("{s:?} (expected f32, bf16, f16 or f8e4m3)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::BF16 => "bf16",
            Self::F16 => "f16",
            Self::F8E4M3 => "f8e4m3",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::BF16 | Self::F16 => 2,
            Self::F8E4M3 => 1,
        }
    }
    /// Whether this is a score type (one of the [`ScoreElem`] types).
    pub fn is_score(self) -> bool {
        matches!(self, Self::F32 | Self::BF16 | Self::F16)
    }
    /// Significant bits of the key: [`ScoreElem::key`] fits in this many bits.
    pub fn key_bits(self) -> u32 {
        (self.size() * 8) as u32
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Maps the raw bits of a float of `BITS` bits (sign-magnitude) to a key whose
/// unsigned order is the float order, with `-0.0 == +0.0` and one NaN key.
///
/// `exp_mask` is the exponent field, `man_mask` the mantissa field.
#[inline(always)]
fn key_from_bits(bits: u32, sign: u32, exp_mask: u32, man_mask: u32, nan: NanPolicy) -> u32 {
    let all = sign | exp_mask | man_mask;
    let mag = bits & (exp_mask | man_mask);
    if mag > exp_mask {
        // NaN, any payload, either sign.
        return match nan {
            NanPolicy::Lowest => 0,
            NanPolicy::Largest => all,
        };
    }
    if mag == 0 {
        // +0.0 and -0.0: the key of +0.0.
        return sign;
    }
    // Positive floats above every negative one; negative ones reversed. NaN-lowest
    // takes key 0, so -inf (key !0xff800000 & all = 0x007fffff for f32) is above it.
    // NaN-largest takes `all`, above +inf (sign | exp_mask).
    if bits & sign == 0 {
        bits | sign
    } else {
        !bits & all
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// One score element type: `f32`, `bf16` or `f16` (sealed: the backends rely
/// on `DTYPE` naming the real layout).
pub trait ScoreElem: sealed::Sealed + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// The order key of this score under `nan` (see the module docs).
    fn key(self, nan: NanPolicy) -> u32;
    /// `-inf`, the value used to pad the value output.
    fn neg_inf() -> Self;
    /// The raw bits, widened (for bitwise comparison in tests).
    fn bits(self) -> u32;
    /// Widening conversion, for data generation and display.
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl ScoreElem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn key(self, nan: NanPolicy) -> u32 {
        key_from_bits(self.to_bits(), 0x8000_0000, 0x7f80_0000, 0x007f_ffff, nan)
    }
    fn neg_inf() -> Self {
        f32::NEG_INFINITY
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl ScoreElem for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn key(self, nan: NanPolicy) -> u32 {
        key_from_bits(self.to_bits() as u32, 0x8000, 0x7f80, 0x007f, nan)
    }
    fn neg_inf() -> Self {
        bf16::NEG_INFINITY
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl ScoreElem for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn key(self, nan: NanPolicy) -> u32 {
        key_from_bits(self.to_bits() as u32, 0x8000, 0x7c00, 0x03ff, nan)
    }
    fn neg_inf() -> Self {
        f16::NEG_INFINITY
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// Packs a key and a column index into one `u64` whose unsigned order is the
/// total order: larger composite = ranks higher. Equal keys order by *lower*
/// column first, so the low half stores `u32::MAX - col`.
#[inline(always)]
pub fn composite(key: u32, col: u32) -> u64 {
    ((key as u64) << 32) | (u32::MAX - col) as u64
}

/// The column index stored in a composite.
#[inline(always)]
pub fn composite_index(c: u64) -> u32 {
    u32::MAX - (c as u32)
}

/// The key stored in a composite.
#[inline(always)]
pub fn composite_key(c: u64) -> u32 {
    (c >> 32) as u32
}
