//! `sparse_mla_prefill` and `sparse_mla_decode`: the sparse MLA attention
//! that reads the indices the selection stage writes, with the semantics of
//! DeepSeek's FlashMLA (deepseek-ai/FlashMLA main 9241ae3:
//! `flash_mla_sparse_fwd` and the sparse path of `flash_mla_with_kvcache`),
//! and its exact float64 reference. `docs/semantics.md` ("Sparse MLA
//! attention") states the same contract in prose.
//!
//! # Contract
//! One query row `r` (prefill: `r < s_q`; decode: `r = (b, s)`) has `h_q`
//! heads `q[r, h, 0..d_qk]` (`d_qk` 512 or 576, `1 <= h_q <= 128`) and a list
//! of `topk >= 1` int32 indices into one KV head (`h_kv = 1`). The key of
//! index `i` is `k_i = kv[i, 0..d_qk]`, its value `v_i = kv[i, 0..512]`
//! (`d_v = 512`: the first 512 of the key).
//!
//! 1. **Valid entries.** Position `p` of the row is attended when `p <
//!    L_r` and its index is in range: `0 <= idx < s_kv` (prefill), `0 <=
//!    idx < num_pages * page_size` (decode, where `idx` is the physical slot
//!    `page * page_size + offset`). Everything else contributes nothing and
//!    its KV row is never read (a NaN there never reaches an output).
//! 2. **`L_r`**: `topk_length[r]` when given (each in `0..=topk`), else the
//!    derived length ([`derive_topk_length`]): one past the last position
//!    holding an in-range index, `0` when there is none. Positions past it
//!    hold only invalid entries, so the derived length attends exactly the
//!    entries of rule 1 without a length: the outputs are the same bits as
//!    passing it explicitly. An invalid entry before a valid one is skipped,
//!    and the valid one after it is attended.
//! 3. **Duplicates**: every occurrence is attended (a softmax over the list
//!    of entries, as FlashMLA's reference gathers one key per entry).
//! 4. With `l_j = sm_scale * (q[r, h] . k_j)` over the attended entries `j`
//!    (in f64, `sm_scale` the f32 the kernel gets): `max_logits = max_j l_j`,
//!    `lse = ln(sum_j exp(l_j))` (natural log), `out = sum_j exp(l_j - lse)
//!    * v_j`. A row with no attended entry: `out = 0`, `lse = +inf`,
//!    `max_logits = -inf`.
//! 5. **`attn_sink`** (f32 per head, optional) scales `out` only: `out *=
//!    exp(lse) / (exp(lse) + exp(sink[h]))`, computed as `1 / (1 + exp(sink -
//!    lse))`; `-inf` changes nothing, `+inf` gives `out = 0`; `lse` and
//!    `max_logits` are unchanged. An empty row's `out` stays 0.
//!
//! Decode reads a paged cache: slot `idx` is token `idx % page_size` of page
//! `idx / page_size`, either `d_qk` dense values (f32 or bf16) or the
//! 656-byte fp8 token of DeepSeek V3.2 ([`CacheFormat::Fp8V32`],
//! [`dequantize_fp8_token`]): 512 e4m3 bytes, 4 little-endian f32 scales
//! (one per 128 values), 64 bf16 rope values (`d_qk = 576`).
//!
//! # The reference
//! [`reference_sparse_mla_prefill`] and [`reference_sparse_mla_decode`]
//! compute rule 4 in f64 from the decoded inputs (bf16, f32 and e4m3 decode
//! exactly into f64; an e4m3 value times its f32 scale is exact in f64),
//! entries in list order. The GPU kernels are tested against them with
//! FlashMLA's tolerances ([`OUT_TOLERANCE`], [`LSE_TOLERANCE`],
//! [`check_close`]). The CPU entry points ([`sparse_mla_prefill`],
//! [`sparse_mla_decode`]) are the reference rounded to f32.

use half::bf16;
use rayon::prelude::*;

use crate::contract::{try_vec, DType, Error, Result};

/// The value width: the first 512 values of every key.
pub const D_V: usize = 512;
/// The key widths a request may have.
pub const D_QK: [usize; 2] = [512, 576];
/// The most query heads a request may have.
pub const MAX_HEADS: usize = 128;
/// Bytes of one token of the fp8 cache ([`CacheFormat::Fp8V32`]).
pub const FP8_TOKEN_BYTES: usize = 656;
/// Values per fp8 scale.
pub const FP8_TILE: usize = 128;
/// Scales per fp8 token.
pub const FP8_TILES: usize = 4;
/// Byte offset of the scales in an fp8 token (after the 512 e4m3 values).
pub const FP8_SCALES_AT: usize = 512;
/// Byte offset of the 64 bf16 rope values in an fp8 token.
pub const FP8_ROPE_AT: usize = FP8_SCALES_AT + 4 * FP8_TILES;
/// Rope values per fp8 token.
pub const FP8_ROPE: usize = 64;

// ---------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// A q / kv element type: `f32` or `bf16` (sealed). Both decode exactly to f64.
pub trait MlaElem: sealed::Sealed + Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// The nearest value (round to nearest even).
    fn from_f32(x: f32) -> Self;
}

impl MlaElem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl MlaElem for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// The q / kv dtypes the operations take.
fn check_elem_dtype(what: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(()),
        other => Err(Error::UnknownDType(format!("sparse MLA takes f32 or bf16 {what}, not {other}"))),
    }
}

// ---------------------------------------------------------------------------
// fp8 e4m3 and the 656-byte token
// ---------------------------------------------------------------------------

/// The exact value of the OCP `float8_e4m3fn` code `code` (1 sign bit, 4
/// exponent bits with bias 7, 3 mantissa bits; subnormals `m * 2^-9`; no
/// infinities; `0x7f` and `0xff` are NaN, the largest finite is `±448`).
pub const fn e4m3_to_f32(code: u8) -> f32 {
    let neg = code & 0x80 != 0;
    let e = ((code >> 3) & 0x0f) as i32;
    let m = (code & 0x07) as u32;
    let mag = if e == 15 && m == 7 {
        f32::NAN
    } else if e == 0 {
        // m * 2^-9, exact in f32.
        m as f32 * (1.0 / 512.0)
    } else {
        // (8 + m) * 2^(e - 10): the f32 with exponent e - 7 and mantissa m.
        f32::from_bits((((e - 7 + 127) as u32) << 23) | (m << 20))
    };
    if neg {
        -mag
    } else {
        mag
    }
}

/// Every e4m3 code's value, built at compile time.
pub static E4M3_TABLE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_to_f32(i as u8);
        i += 1;
    }
    t
};

/// The e4m3 code nearest `x` (ties to the even code, i.e. the even
/// mantissa), as `torch`'s cast to `float8_e4m3fn` rounds: magnitudes past
/// 448 saturate to `±448` (FlashMLA's quantizer never produces them, its
/// scales keep `|x / scale| <= 448`), NaN gives `0x7f`. For building test
/// caches; the operations only decode.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs() as f64;
    // The finite non-negative codes 0x00..=0x7e ascend in value.
    let (mut lo, mut hi) = (0u8, 0x7eu8);
    if a >= E4M3_TABLE[0x7e] as f64 {
        return sign | 0x7e;
    }
    // Largest code with value <= a.
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if E4M3_TABLE[mid as usize] as f64 <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let below = lo;
    let above = lo + 1;
    let (dl, du) = (a - E4M3_TABLE[below as usize] as f64, E4M3_TABLE[above as usize] as f64 - a);
    let code = if dl < du || (dl == du && below & 1 == 0) { below } else { above };
    sign | code
}

/// Decodes one 656-byte fp8 token into its 576 key values: `key[d] =
/// e4m3(token[d]) * scale[d / 128]` for `d < 512` (the scales: 4
/// little-endian f32 at bytes 512..528), `key[512 + j]` = the bf16 at bytes
/// `528 + 2j` (little-endian) for `j < 64`. Exact in f64.
pub fn dequantize_fp8_token(token: &[u8], key: &mut [f64]) {
    assert!(token.len() >= FP8_TOKEN_BYTES && key.len() >= 576);
    let mut scales = [0f64; FP8_TILES];
    for (t, s) in scales.iter_mut().enumerate() {
        let at = FP8_SCALES_AT + 4 * t;
        *s = f32::from_le_bytes([token[at], token[at + 1], token[at + 2], token[at + 3]]) as f64;
    }
    for d in 0..D_V {
        key[d] = E4M3_TABLE[token[d] as usize] as f64 * scales[d / FP8_TILE];
    }
    for j in 0..FP8_ROPE {
        let at = FP8_ROPE_AT + 2 * j;
        key[D_V + j] = bf16::from_bits(u16::from_le_bytes([token[at], token[at + 1]])).to_f64();
    }
}

/// FlashMLA's quantizer (`tests/quant.py`, the V3.2 layout) for one token of
/// 576 values: per 128-value tile the scale `2^ceil(log2(max(amax / 448,
/// 1e-4)))` (a power of two), the e4m3 code of `value / scale`
/// ([`f32_to_e4m3`]), and the last 64 values as bf16 (rounded to nearest).
/// For building test caches.
pub fn quantize_fp8_token(values: &[f32]) -> [u8; FP8_TOKEN_BYTES] {
    assert!(values.len() == 576, "an fp8 token holds 576 values");
    let mut t = [0u8; FP8_TOKEN_BYTES];
    for tile in 0..FP8_TILES {
        let vals = &values[tile * FP8_TILE..(tile + 1) * FP8_TILE];
        let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = (amax / 448.0).max(1e-4);
        let scale = 2f32.powi(inv.log2().ceil() as i32);
        t[FP8_SCALES_AT + 4 * tile..FP8_SCALES_AT + 4 * tile + 4].copy_from_slice(&scale.to_le_bytes());
        for (j, &v) in vals.iter().enumerate() {
            t[tile * FP8_TILE + j] = f32_to_e4m3(v / scale);
        }
    }
    for j in 0..FP8_ROPE {
        let b = bf16::from_f32(values[D_V + j]).to_bits().to_le_bytes();
        t[FP8_ROPE_AT + 2 * j..FP8_ROPE_AT + 2 * j + 2].copy_from_slice(&b);
    }
    t
}

// ---------------------------------------------------------------------------
// Specs
// ---------------------------------------------------------------------------

pub(crate) fn bad(what: &'static str, value: impl ToString, expected: &'static str) -> Error {
    Error::InvalidOption { what, value: value.to_string(), expected }
}

/// The checks both operations share: heads, widths, topk, scale.
fn check_common(h_q: usize, d_qk: usize, d_v: usize, topk: usize, sm_scale: f32) -> Result<()> {
    if h_q == 0 || h_q > MAX_HEADS {
        return Err(bad("h_q", h_q, "1..=128"));
    }
    if !D_QK.contains(&d_qk) {
        return Err(bad("d_qk", d_qk, "512 or 576"));
    }
    if d_v != D_V {
        return Err(bad("d_v", d_v, "512 (the first 512 values of each key)"));
    }
    if topk == 0 {
        return Err(bad("topk", 0, ">= 1"));
    }
    if topk > i32::MAX as usize {
        return Err(Error::too_large("topk", topk as u128));
    }
    if !sm_scale.is_finite() {
        return Err(bad("sm_scale", sm_scale, "a finite float"));
    }
    Ok(())
}

/// `a * b * ...` or an error naming `what`.
pub(crate) fn product(what: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Shape(format!("{what}: {dims:?} overflows")))
}

pub(crate) fn check_len(what: &'static str, got: usize, need: usize) -> Result<()> {
    if got != need {
        return Err(Error::BufferSize { what, got, need });
    }
    Ok(())
}

/// A sparse prefill request (`flash_mla_sparse_fwd`): everything but the data.
///
/// `q [s_q, h_q, d_qk]` and `indices [s_q, topk]` (FlashMLA's `[s_q, 1,
/// topk]`) are dense; `kv [s_kv, d_qk]` (FlashMLA's `[s_kv, 1, d_qk]`) has
/// rows `kv_stride >= d_qk` elements apart. Outputs: `out [s_q, h_q, d_v]`,
/// `max_logits [s_q, h_q]`, `lse [s_q, h_q]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SparseMlaPrefill {
    pub s_q: usize,
    pub s_kv: usize,
    pub h_q: usize,
    pub d_qk: usize,
    pub d_v: usize,
    pub topk: usize,
    /// Elements between the starts of consecutive kv rows (`>= d_qk`).
    pub kv_stride: usize,
    pub sm_scale: f32,
    /// The dtype of q and kv (f32 or bf16).
    pub dtype: DType,
}

impl SparseMlaPrefill {
    /// A bf16 request with `d_v = 512` and dense kv rows.
    pub fn new(s_q: usize, s_kv: usize, h_q: usize, d_qk: usize, topk: usize, sm_scale: f32) -> Self {
        Self { s_q, s_kv, h_q, d_qk, d_v: D_V, topk, kv_stride: d_qk, sm_scale, dtype: DType::BF16 }
    }
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    pub fn with_kv_stride(mut self, kv_stride: usize) -> Self {
        self.kv_stride = kv_stride;
        self
    }
    pub fn with_d_v(mut self, d_v: usize) -> Self {
        self.d_v = d_v;
        self
    }

    /// The shape rules: `1 <= h_q <= 128`, `d_qk` 512 or 576, `d_v` 512,
    /// `1 <= topk <= i32::MAX`, a finite scale, f32 or bf16, `kv_stride >=
    /// d_qk`, sizes that do not overflow.
    pub fn validate(&self) -> Result<()> {
        check_common(self.h_q, self.d_qk, self.d_v, self.topk, self.sm_scale)?;
        check_elem_dtype("q / kv", self.dtype)?;
        if self.kv_stride < self.d_qk {
            return Err(Error::StrideTooShort { stride: self.kv_stride, cols: self.d_qk });
        }
        product("q", &[self.s_q, self.h_q, self.d_qk])?;
        product("out", &[self.s_q, self.h_q, self.d_v])?;
        product("indices", &[self.s_q, self.topk])?;
        self.kv_len()?;
        Ok(())
    }

    /// Elements the kv buffer must hold: `(s_kv - 1) * kv_stride + d_qk`.
    pub fn kv_len(&self) -> Result<usize> {
        if self.s_kv == 0 {
            return Ok(0);
        }
        (self.s_kv - 1)
            .checked_mul(self.kv_stride)
            .and_then(|x| x.checked_add(self.d_qk))
            .ok_or_else(|| Error::Shape(format!("kv: {} rows of stride {} overflow", self.s_kv, self.kv_stride)))
    }
}

/// The paged-cache rules of both attention operations (sparse MLA's decode,
/// QSA attention): `page_size >= 1`, a token stride of at least the token's
/// `width` elements, and a page's tokens before the next page (`page_stride
/// >= (page_size - 1) * token_stride + width`, when there are two pages or
/// more). `token` describes a token for the error.
pub(crate) fn check_pages(
    page_size: usize,
    num_pages: usize,
    page_stride: usize,
    token_stride: usize,
    width: usize,
    token: impl FnOnce() -> String,
) -> Result<()> {
    if page_size == 0 {
        return Err(bad("page_size", 0, ">= 1"));
    }
    if token_stride < width {
        return Err(Error::Shape(format!(
            "the cache's token stride {token_stride} is shorter than a token ({})",
            token()
        )));
    }
    let page_extent = (page_size - 1)
        .checked_mul(token_stride)
        .and_then(|x| x.checked_add(width))
        .ok_or_else(|| Error::Shape("the cache's page extent overflows".into()))?;
    if num_pages > 1 && page_stride < page_extent {
        return Err(Error::Shape(format!(
            "the cache's page stride {page_stride} is shorter than a page ({page_extent} elements: {page_size} tokens of stride {token_stride})"
        )));
    }
    Ok(())
}

/// Elements a paged cache's buffer must hold: `(num_pages - 1) *
/// page_stride + (page_size - 1) * token_stride + width` (0 without pages).
pub(crate) fn paged_len(
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    width: usize,
) -> Result<usize> {
    if num_pages == 0 {
        return Ok(0);
    }
    (num_pages - 1)
        .checked_mul(page_stride)
        .and_then(|x| x.checked_add((page_size - 1).checked_mul(token_stride)?))
        .and_then(|x| x.checked_add(width))
        .ok_or_else(|| Error::Shape("the cache's size overflows".into()))
}

/// How a paged decode cache stores a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheFormat {
    /// `d_qk` f32 values.
    F32,
    /// `d_qk` bf16 values.
    BF16,
    /// DeepSeek V3.2's 656-byte fp8 token (`d_qk = 576`): 512 e4m3 values, 4
    /// f32 scales, 64 bf16 rope values ([`dequantize_fp8_token`]).
    Fp8V32,
}

impl CacheFormat {
    /// Cache elements (bytes for fp8) of one token.
    pub fn token_width(self, d_qk: usize) -> usize {
        match self {
            CacheFormat::F32 | CacheFormat::BF16 => d_qk,
            CacheFormat::Fp8V32 => FP8_TOKEN_BYTES,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            CacheFormat::F32 => "f32",
            CacheFormat::BF16 => "bf16",
            CacheFormat::Fp8V32 => "fp8 (656-byte V3.2 tokens)",
        }
    }
}

/// A paged decode cache in host memory, as one buffer of its elements (bytes
/// for fp8): token `t` of page `p` starts at element `p * page_stride + t *
/// token_stride` ([`SparseMlaDecode`] holds the geometry).
#[derive(Debug, Clone, Copy)]
pub enum PagedKvCache<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    Fp8(&'a [u8]),
}

impl PagedKvCache<'_> {
    pub fn format(&self) -> CacheFormat {
        match self {
            PagedKvCache::F32(_) => CacheFormat::F32,
            PagedKvCache::BF16(_) => CacheFormat::BF16,
            PagedKvCache::Fp8(_) => CacheFormat::Fp8V32,
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            PagedKvCache::F32(d) => d.len(),
            PagedKvCache::BF16(d) => d.len(),
            PagedKvCache::Fp8(d) => d.len(),
        }
    }
    /// The key of the token starting at element `at`, into `key[..d_qk]`.
    fn read(&self, at: usize, d_qk: usize, key: &mut [f64]) {
        match self {
            PagedKvCache::F32(d) => key[..d_qk].iter_mut().zip(&d[at..at + d_qk]).for_each(|(k, &v)| *k = v as f64),
            PagedKvCache::BF16(d) => key[..d_qk].iter_mut().zip(&d[at..at + d_qk]).for_each(|(k, &v)| *k = v.to_f64()),
            PagedKvCache::Fp8(d) => dequantize_fp8_token(&d[at..at + FP8_TOKEN_BYTES], key),
        }
    }
}

/// A sparse decode request (the sparse `flash_mla_with_kvcache`):
/// everything but the data.
///
/// `q [batch, s_q, h_q, d_qk]` (f32 or bf16) and `indices [batch, s_q, topk]`
/// (physical slots `page * page_size + offset`) are dense; the cache holds
/// `num_pages` pages of `page_size` tokens (FlashMLA's `k_cache [num_pages,
/// page_size, 1, d_qk or 656]`), `page_stride` and `token_stride` elements
/// (bytes for fp8) apart. Outputs: `out [batch, s_q, h_q, d_v]`, `lse
/// [batch, h_q, s_q]` (FlashMLA's layout).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SparseMlaDecode {
    pub batch: usize,
    pub s_q: usize,
    pub h_q: usize,
    pub d_qk: usize,
    pub d_v: usize,
    pub topk: usize,
    pub num_pages: usize,
    pub page_size: usize,
    /// Cache elements between the starts of consecutive pages.
    pub page_stride: usize,
    /// Cache elements between the starts of consecutive tokens of a page.
    pub token_stride: usize,
    pub cache: CacheFormat,
    /// The dtype of q (f32 or bf16).
    pub q_dtype: DType,
    pub sm_scale: f32,
}

impl SparseMlaDecode {
    /// A request with bf16 q, `d_v = 512` and packed pages (`token_stride`
    /// = the token's width, `page_stride = page_size * token_stride`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        s_q: usize,
        h_q: usize,
        d_qk: usize,
        topk: usize,
        num_pages: usize,
        page_size: usize,
        cache: CacheFormat,
        sm_scale: f32,
    ) -> Self {
        let w = cache.token_width(d_qk);
        Self {
            batch,
            s_q,
            h_q,
            d_qk,
            d_v: D_V,
            topk,
            num_pages,
            page_size,
            page_stride: page_size * w,
            token_stride: w,
            cache,
            q_dtype: DType::BF16,
            sm_scale,
        }
    }
    pub fn with_strides(mut self, page_stride: usize, token_stride: usize) -> Self {
        self.page_stride = page_stride;
        self.token_stride = token_stride;
        self
    }
    pub fn with_q_dtype(mut self, q_dtype: DType) -> Self {
        self.q_dtype = q_dtype;
        self
    }
    pub fn with_d_v(mut self, d_v: usize) -> Self {
        self.d_v = d_v;
        self
    }

    /// Query rows: `batch * s_q`.
    pub fn rows(&self) -> usize {
        self.batch * self.s_q
    }
    /// Slots of the cache: `num_pages * page_size` (the valid indices are
    /// `0..slots`, capped at `i32::MAX + 1`).
    pub fn slots(&self) -> usize {
        self.num_pages.saturating_mul(self.page_size)
    }

    /// The shape rules of [`SparseMlaPrefill::validate`], and: f32 or bf16
    /// q; an fp8 cache has `d_qk = 576`; `page_size >= 1`; `token_stride >=`
    /// the token's width; a page's tokens fit before the next page
    /// (`page_stride >= (page_size - 1) * token_stride + width`).
    pub fn validate(&self) -> Result<()> {
        check_common(self.h_q, self.d_qk, self.d_v, self.topk, self.sm_scale)?;
        check_elem_dtype("q", self.q_dtype)?;
        if self.cache == CacheFormat::Fp8V32 && self.d_qk != 576 {
            return Err(bad("d_qk", self.d_qk, "576 with the 656-byte fp8 cache"));
        }
        let w = self.cache.token_width(self.d_qk);
        check_pages(self.page_size, self.num_pages, self.page_stride, self.token_stride, w, || {
            format!("{w} {} elements", self.cache.name())
        })?;
        product("q", &[self.batch, self.s_q, self.h_q, self.d_qk])?;
        product("out", &[self.batch, self.s_q, self.h_q, self.d_v])?;
        product("indices", &[self.batch, self.s_q, self.topk])?;
        self.cache_len()?;
        Ok(())
    }

    /// Elements the cache buffer must hold: `(num_pages - 1) * page_stride +
    /// (page_size - 1) * token_stride + width`.
    pub fn cache_len(&self) -> Result<usize> {
        paged_len(
            self.num_pages,
            self.page_size,
            self.page_stride,
            self.token_stride,
            self.cache.token_width(self.d_qk),
        )
    }

    /// The cache element where slot `slot` (valid: `< slots()`) starts.
    pub fn slot_at(&self, slot: usize) -> usize {
        (slot / self.page_size) * self.page_stride + (slot % self.page_size) * self.token_stride
    }
}

// ---------------------------------------------------------------------------
// topk_length
// ---------------------------------------------------------------------------

/// The derived `topk_length` of each of the `indices.len() / topk` rows
/// (seed 000's rule): one past the last position whose index is in
/// `0..bound`, `0` when there is none. `bound` is `s_kv` (prefill) or the
/// cache's slots (decode).
pub fn derive_topk_length(indices: &[i32], topk: usize, bound: usize) -> Vec<i32> {
    assert!(topk > 0 && indices.len().is_multiple_of(topk));
    indices.chunks_exact(topk).map(|row| derived_len(row, bound) as i32).collect()
}

#[inline]
fn in_range(idx: i32, bound: usize) -> bool {
    idx >= 0 && (idx as usize) < bound
}

fn derived_len(row: &[i32], bound: usize) -> usize {
    row.iter().rposition(|&i| in_range(i, bound)).map_or(0, |p| p + 1)
}

/// Checks explicit lengths: `rows` entries, each in `0..=topk`.
fn check_lengths(lengths: &[i32], rows: usize, topk: usize) -> Result<()> {
    if lengths.len() != rows {
        return Err(Error::Shape(format!("topk_length has {} entries but there are {rows} query rows", lengths.len())));
    }
    for (r, &l) in lengths.iter().enumerate() {
        if l < 0 || l as usize > topk {
            return Err(bad("topk_length", format!("{l} at row {r} (topk = {topk})"), "0..=topk"));
        }
    }
    Ok(())
}

fn check_sink(sink: Option<&[f32]>, h_q: usize) -> Result<()> {
    match sink {
        Some(s) if s.len() != h_q => {
            Err(Error::Shape(format!("attn_sink has {} entries but h_q = {h_q} (one per query head)", s.len())))
        }
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// The reference
// ---------------------------------------------------------------------------

/// [`reference_sparse_mla_prefill`]'s result, in f64 (FlashMLA's layouts).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillOutput<T> {
    /// `[s_q, h_q, d_v]`.
    pub out: Vec<T>,
    /// `[s_q, h_q]`: the largest scaled logit, `-inf` for an empty row.
    pub max_logits: Vec<T>,
    /// `[s_q, h_q]`: natural-log sum of exp of the scaled logits, `+inf` for
    /// an empty row.
    pub lse: Vec<T>,
}

/// [`reference_sparse_mla_decode`]'s result (FlashMLA's layouts).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeOutput<T> {
    /// `[batch, s_q, h_q, d_v]`.
    pub out: Vec<T>,
    /// `[batch, h_q, s_q]` (FlashMLA's transposed layout).
    pub lse: Vec<T>,
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

fn to_bf16(v: &[f64]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f64(x)).collect()
}

impl PrefillOutput<f64> {
    /// Every output rounded to f32 (round to nearest).
    pub fn to_f32(&self) -> PrefillOutput<f32> {
        PrefillOutput { out: to_f32(&self.out), max_logits: to_f32(&self.max_logits), lse: to_f32(&self.lse) }
    }
    /// `out` rounded to bf16 (straight from f64, round to nearest even), as
    /// FlashMLA returns it.
    pub fn out_bf16(&self) -> Vec<bf16> {
        to_bf16(&self.out)
    }
}

impl DecodeOutput<f64> {
    /// Every output rounded to f32 (round to nearest).
    pub fn to_f32(&self) -> DecodeOutput<f32> {
        DecodeOutput { out: to_f32(&self.out), lse: to_f32(&self.lse) }
    }
    /// `out` rounded to bf16 (straight from f64), as FlashMLA returns it.
    pub fn out_bf16(&self) -> Vec<bf16> {
        to_bf16(&self.out)
    }
}

/// NaN-propagating max (`f64::max` drops NaN).
#[inline]
pub(crate) fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Rule 4 and 5 for one query row: `q [h_q, d_qk]`, `keys [n, d_qk]` (the
/// attended entries, in list order), into `out [h_q, d_v]`, `maxl [h_q]`,
/// `lse [h_q]`.
#[allow(clippy::too_many_arguments)]
fn attend_row(
    q: &[f64],
    keys: &[f64],
    n: usize,
    d_qk: usize,
    d_v: usize,
    scale: f64,
    sink: Option<&[f32]>,
    out: &mut [f64],
    maxl: &mut [f64],
    lse: &mut [f64],
) {
    let h_q = maxl.len();
    let mut logits = vec![0f64; n];
    for h in 0..h_q {
        let o = &mut out[h * d_v..(h + 1) * d_v];
        o.fill(0.0);
        if n == 0 {
            maxl[h] = f64::NEG_INFINITY;
            lse[h] = f64::INFINITY;
            continue;
        }
        let qh = &q[h * d_qk..(h + 1) * d_qk];
        for (j, l) in logits.iter_mut().enumerate() {
            let k = &keys[j * d_qk..(j + 1) * d_qk];
            *l = scale * qh.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
        }
        let m = logits.iter().fold(f64::NEG_INFINITY, |a, &b| max_nan(a, b));
        let s: f64 = logits.iter().map(|&l| (l - m).exp()).sum();
        let row_lse = m + s.ln();
        let factor = match sink {
            None => 1.0,
            Some(s) => 1.0 / (1.0 + (s[h] as f64 - row_lse).exp()),
        };
        for (j, &l) in logits.iter().enumerate() {
            let w = (l - m).exp() / s * factor;
            let v = &keys[j * d_qk..j * d_qk + d_v];
            o.iter_mut().zip(v).for_each(|(x, &y)| *x += w * y);
        }
        maxl[h] = m;
        lse[h] = row_lse;
    }
}

/// The attended positions of one index row (rules 1 and 2).
fn attended(row: &[i32], len: Option<i32>, bound: usize) -> impl Iterator<Item = usize> + '_ {
    let l = len.map_or(row.len(), |l| l as usize);
    row[..l].iter().filter(move |&&i| in_range(i, bound)).map(|&i| i as usize)
}

/// The checks of a prefill request on host data (the reference's, and the
/// CUDA engine's host form's: the same errors): the spec, the dtype, every
/// buffer's size, explicit lengths in `0..=topk`, one sink per head.
pub(crate) fn check_prefill_request<T: MlaElem>(
    spec: &SparseMlaPrefill,
    q: &[T],
    kv: &[T],
    indices: &[i32],
    topk_length: Option<&[i32]>,
    attn_sink: Option<&[f32]>,
) -> Result<()> {
    spec.validate()?;
    if T::DTYPE != spec.dtype {
        return Err(Error::UnknownDType(format!("the data is {} but the spec says {}", T::DTYPE, spec.dtype)));
    }
    let SparseMlaPrefill { s_q, h_q, d_qk, topk, .. } = *spec;
    check_len("q", q.len(), s_q * h_q * d_qk)?;
    let kv_need = spec.kv_len()?;
    if kv.len() < kv_need {
        return Err(Error::BufferSize { what: "kv", got: kv.len(), need: kv_need });
    }
    check_len("indices", indices.len(), s_q * topk)?;
    if let Some(l) = topk_length {
        check_lengths(l, s_q, topk)?;
    }
    check_sink(attn_sink, h_q)
}

/// The checks of a decode request on host data (as
/// [`check_prefill_request`]); returns how explicit lengths are laid out:
/// `Some(true)` one per row (`batch * s_q`), `Some(false)` one per request
/// (`batch`; when both counts agree, per row), `None` derived.
pub(crate) fn check_decode_request<Q: MlaElem>(
    spec: &SparseMlaDecode,
    q: &[Q],
    cache: PagedKvCache<'_>,
    indices: &[i32],
    topk_length: Option<&[i32]>,
    attn_sink: Option<&[f32]>,
) -> Result<Option<bool>> {
    spec.validate()?;
    if Q::DTYPE != spec.q_dtype {
        return Err(Error::UnknownDType(format!("q is {} but the spec says {}", Q::DTYPE, spec.q_dtype)));
    }
    if cache.format() != spec.cache {
        return Err(Error::UnknownDType(format!(
            "the cache is {} but the spec says {}",
            cache.format().name(),
            spec.cache.name()
        )));
    }
    let SparseMlaDecode { batch, h_q, d_qk, topk, .. } = *spec;
    let rows = spec.rows();
    check_len("q", q.len(), rows * h_q * d_qk)?;
    let need = spec.cache_len()?;
    if cache.len() < need {
        return Err(Error::BufferSize { what: "k_cache", got: cache.len(), need });
    }
    check_len("indices", indices.len(), rows * topk)?;
    let per_row = match topk_length {
        None => None,
        Some(l) if l.len() == rows => {
            check_lengths(l, rows, topk)?;
            Some(true)
        }
        Some(l) if l.len() == batch => {
            check_lengths(l, batch, topk)?;
            Some(false)
        }
        Some(l) => {
            return Err(Error::Shape(format!(
                "topk_length has {} entries; expected batch = {batch} (one per request) or batch * s_q = {rows}",
                l.len()
            )))
        }
    };
    check_sink(attn_sink, h_q)?;
    Ok(per_row)
}

/// The exact sparse prefill (module docs, rules 1-5) in f64, over host
/// slices: `q [s_q, h_q, d_qk]`, `kv` (`s_kv` rows of `kv_stride`),
/// `indices [s_q, topk]`, `topk_length [s_q]` (optional; derived when
/// absent), `attn_sink [h_q]` (optional). Only the kv rows of attended
/// entries are read. Rows run in parallel; the result does not depend on
/// the thread count.
pub fn reference_sparse_mla_prefill<T: MlaElem>(
    spec: &SparseMlaPrefill,
    q: &[T],
    kv: &[T],
    indices: &[i32],
    topk_length: Option<&[i32]>,
    attn_sink: Option<&[f32]>,
) -> Result<PrefillOutput<f64>> {
    check_prefill_request(spec, q, kv, indices, topk_length, attn_sink)?;
    let SparseMlaPrefill { s_q, s_kv, h_q, d_qk, d_v, topk, kv_stride, .. } = *spec;

    let mut out = try_vec("out", s_q * h_q * d_v, 0f64)?;
    let mut maxl = try_vec("max_logits", s_q * h_q, 0f64)?;
    let mut lse = try_vec("lse", s_q * h_q, 0f64)?;
    let scale = spec.sm_scale as f64;
    out.par_chunks_mut(h_q * d_v).zip(maxl.par_chunks_mut(h_q).zip(lse.par_chunks_mut(h_q))).enumerate().for_each(
        |(r, (o, (m, l)))| {
            let qr: Vec<f64> = q[r * h_q * d_qk..(r + 1) * h_q * d_qk].iter().map(|x| x.to_f64()).collect();
            let row = &indices[r * topk..(r + 1) * topk];
            let mut keys = Vec::new();
            let mut n = 0;
            for i in attended(row, topk_length.map(|t| t[r]), s_kv) {
                keys.extend(kv[i * kv_stride..i * kv_stride + d_qk].iter().map(|x| x.to_f64()));
                n += 1;
            }
            attend_row(&qr, &keys, n, d_qk, d_v, scale, attn_sink, o, m, l);
        },
    );
    Ok(PrefillOutput { out, max_logits: maxl, lse })
}

/// The exact sparse decode (module docs, rules 1-5) in f64, over host
/// slices: `q [batch, s_q, h_q, d_qk]`, the paged `cache`, `indices [batch,
/// s_q, topk]` (slots), `topk_length` (optional; `batch` entries, one per
/// request for all its `s_q` rows as FlashMLA takes it, or `batch * s_q`,
/// one per row; derived per row when absent), `attn_sink [h_q]` (optional).
/// Only the tokens of attended entries are read.
pub fn reference_sparse_mla_decode<Q: MlaElem>(
    spec: &SparseMlaDecode,
    q: &[Q],
    cache: PagedKvCache<'_>,
    indices: &[i32],
    topk_length: Option<&[i32]>,
    attn_sink: Option<&[f32]>,
) -> Result<DecodeOutput<f64>> {
    let layout = check_decode_request(spec, q, cache, indices, topk_length, attn_sink)?;
    let SparseMlaDecode { batch, s_q, h_q, d_qk, d_v, topk, .. } = *spec;
    let rows = spec.rows();
    let per_row: Option<Vec<i32>> = match (topk_length, layout) {
        (Some(l), Some(true)) => Some(l.to_vec()),
        (Some(l), Some(false)) => Some(l.iter().flat_map(|&x| std::iter::repeat_n(x, s_q)).collect()),
        _ => None,
    };

    let slots = spec.slots();
    let mut out = try_vec("out", rows * h_q * d_v, 0f64)?;
    let mut maxl = try_vec("max_logits", rows * h_q, 0f64)?;
    let mut lse_rows = try_vec("lse", rows * h_q, 0f64)?;
    let scale = spec.sm_scale as f64;
    out.par_chunks_mut(h_q * d_v).zip(maxl.par_chunks_mut(h_q).zip(lse_rows.par_chunks_mut(h_q))).enumerate().for_each(
        |(r, (o, (m, l)))| {
            let qr: Vec<f64> = q[r * h_q * d_qk..(r + 1) * h_q * d_qk].iter().map(|x| x.to_f64()).collect();
            let row = &indices[r * topk..(r + 1) * topk];
            let mut keys = Vec::new();
            let mut n = 0;
            for slot in attended(row, per_row.as_ref().map(|t| t[r]), slots) {
                let at = keys.len();
                keys.resize(at + d_qk, 0.0);
                cache.read(spec.slot_at(slot), d_qk, &mut keys[at..]);
                n += 1;
            }
            attend_row(&qr, &keys, n, d_qk, d_v, scale, attn_sink, o, m, l);
        },
    );
    // lse [b, s, h] -> FlashMLA's [b, h, s].
    let mut lse = try_vec("lse", rows * h_q, 0f64)?;
    for b in 0..batch {
        for s in 0..s_q {
            for h in 0..h_q {
                lse[(b * h_q + h) * s_q + s] = lse_rows[(b * s_q + s) * h_q + h];
            }
        }
    }
    Ok(DecodeOutput { out, lse })
}

/// The CPU engine's sparse prefill: [`reference_sparse_mla_prefill`]
/// rounded to f32.
pub fn sparse_mla_prefill<T: MlaElem>(
    spec: &SparseMlaPrefill,
    q: &[T],
    kv: &[T],
    indices: &[i32],
    topk_length: Option<&[i32]>,
    attn_sink: Option<&[f32]>,
) -> Result<PrefillOutput<f32>> {
    Ok(reference_sparse_mla_prefill(spec, q, kv, indices, topk_length, attn_sink)?.to_f32())
}

/// The CPU engine's sparse decode: [`reference_sparse_mla_decode`] rounded
/// to f32.
pub fn sparse_mla_decode<Q: MlaElem>(
    spec: &SparseMlaDecode,
    q: &[Q],
    cache: PagedKvCache<'_>,
    indices: &[i32],
    topk_length: Option<&[i32]>,
    attn_sink: Option<&[f32]>,
) -> Result<DecodeOutput<f32>> {
    Ok(reference_sparse_mla_decode(spec, q, cache, indices, topk_length, attn_sink)?.to_f32())
}

// ---------------------------------------------------------------------------
// Tolerances (what a GPU output must meet against the reference)
// ---------------------------------------------------------------------------

/// FlashMLA's closeness test (`kernelkit.check_is_allclose`): the `+inf`,
/// `-inf` and NaN entries of both sides must sit at the same positions (then
/// count as 0); every other element must have `|got - want| < abs` or
/// `|got - want| / (|want| + 1e-6) < rel`; and the cosine difference `1 - 2
/// sum(got * want) / (sum(got^2) + sum(want^2))` (0 when `sum(want^2) <
/// 1e-12`) must be at most `cos_diff`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub abs: f64,
    pub rel: f64,
    pub cos_diff: f64,
}

/// `out` (and its bf16 rounding): FlashMLA's sparse tests' bound.
pub const OUT_TOLERANCE: Tolerance = Tolerance { abs: 8e-4, rel: 3.01 / 128.0, cos_diff: 7e-6 };
/// `lse` and `max_logits`: abs 1e-6, rel 2.01/65536 (and FlashMLA's default
/// cosine bound, 1e-7).
pub const LSE_TOLERANCE: Tolerance = Tolerance { abs: 1e-6, rel: 2.01 / 65536.0, cos_diff: 1e-7 };

/// Checks `got` against the reference `want` under `tol` (see
/// [`Tolerance`]); the error says what failed, where, and by how much.
pub fn check_close(what: &str, got: &[f32], want: &[f64], tol: Tolerance) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, the reference has {}", got.len(), want.len()));
    }
    let class = |x: f64| {
        if x.is_nan() {
            1
        } else if x == f64::INFINITY {
            2
        } else if x == f64::NEG_INFINITY {
            3
        } else {
            0
        }
    };
    let (mut dot, mut gg, mut ww) = (0f64, 0f64, 0f64);
    let mut worst: Option<(usize, f64, f64)> = None;
    let mut failed = 0usize;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let (cg, cw) = (class(g), class(w));
        if cg != cw {
            return Err(format!("{what}[{i}] = {g} but the reference has {w} (inf / NaN positions differ)"));
        }
        if cg != 0 {
            continue;
        }
        dot += g * w;
        gg += g * g;
        ww += w * w;
        let err = (g - w).abs();
        if !(err < tol.abs || err / (w.abs() + 1e-6) < tol.rel) {
            failed += 1;
            if worst.is_none_or(|(_, e, _)| err > e) {
                worst = Some((i, err, w));
            }
        }
    }
    if let Some((i, err, w)) = worst {
        return Err(format!(
            "{what}: {failed} of {} elements off (abs {} / rel {}); worst at {i}: {} vs {w} (abs err {err:e})",
            got.len(),
            tol.abs,
            tol.rel,
            got[i]
        ));
    }
    let cos = if ww < 1e-12 { 0.0 } else { 1.0 - 2.0 * dot / (gg + ww) };
    if cos.abs() > tol.cos_diff {
        return Err(format!("{what}: cosine difference {cos:e} exceeds {:e}", tol.cos_diff));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

pub mod check;
pub mod device;
